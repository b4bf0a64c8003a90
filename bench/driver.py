"""A load driver: at most ``concurrency`` requests in flight, each sent when a slot frees up,
over one aiohttp session; closed-loop by default, open-loop when given an arrival schedule.

Two modes:
- ``run_conversations``: a workload of conversations. A conversation's rounds run in order,
  each carrying the real answers to the earlier ones; different conversations run
  concurrently. Streaming chat completions with usage, so TTFT and token counts are measured.
  Conversations start one after another (``start_interval_s``) or at the times of an arrival
  schedule (``arrivals``, e.g. ``workloads.poisson_arrivals``): open-loop load, where a start
  does not wait for earlier requests to finish (give a ``concurrency`` the run never reaches).
- ``run_plain``: N copies of one request body (the overhead benchmark), streaming or not.

Both are bounded: a cap on requests and a timeout per request, so a run always ends by itself.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from tqdm import tqdm

from bench.workloads import Conversation, Message, RequestSpec, Tool, total_requests
from gateway import headers

CHAT_PATH = "/v1/chat/completions"
DEFAULT_TIMEOUT_S = 60.0
_NO_STATUS = 0
"""Status of a request that got no HTTP response (connection refused, timeout)."""


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one request did, as the client saw it."""

    status: int
    latency_s: float
    """From sending the request to the end of the response body."""
    ttft_s: float | None = None
    """Time to the first non-empty content delta, or to the end of an answer with no content
    (streaming only)."""
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the replica served from its prefix cache, as it reported in usage."""
    replica: str | None = None
    route: str | None = None
    error: str | None = None
    conversation: str = ""
    group: int = -1
    round: int = 0
    messages: tuple[Message, ...] = field(default=(), repr=False)
    """The chat messages sent (``run_conversations`` only): what a cache could have reused."""
    tools: tuple[Tool, ...] = field(default=(), repr=False)
    """The tool definitions sent with them: rendered ahead of the messages, so cached too."""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


@dataclass(frozen=True, slots=True)
class RunResult:
    results: tuple[RequestResult, ...]
    wall_s: float
    planned: int
    """Requests the workload holds; those not sent were cut by the request cap, or followed a
    failed round of their conversation (its next round needs the answer)."""

    @property
    def sent(self) -> int:
        return len(self.results)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    @property
    def not_sent(self) -> int:
        return self.planned - self.sent

    def ttfts(self) -> list[float]:
        return [r.ttft_s for r in self.results if r.ok and r.ttft_s is not None]

    def latencies(self) -> list[float]:
        return [r.latency_s for r in self.results if r.ok]


_SIM_ID = re.compile(r"(?:chatcmpl|cmpl)-(\d+)-[0-9a-f]{32}")
"""A simulated replica's response id when the caller gave no request id: its port leads."""


def answered_by(response_id: object) -> str | None:
    """The simulated replica a response id names ("sim:PORT"), for targets whose answers carry
    no x-gateway-replica (the peer routers); None for any other id."""
    match = _SIM_ID.fullmatch(response_id) if isinstance(response_id, str) else None
    return f"sim:{match.group(1)}" if match else None


def replica_name(url: str) -> str:
    """A replica's name as the gateway spells it in x-gateway-replica (its URL's host:port)."""
    return urlsplit(url).netloc


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between ranks (numpy's default);
    NaN for no values, so an empty run prints as such instead of as a fast one."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(slots=True)
class _Reply:
    """A response body, as far as it was read."""

    text: list[str] = field(default_factory=list)
    ttft_s: float | None = None
    usage: Mapping[str, Any] | None = None
    chunks: int = 0
    error: str | None = None
    id: object = None


def _usage_numbers(usage: Mapping[str, Any] | None, chunks: int) -> tuple[int, int, int]:
    if not usage:
        return chunks, 0, 0
    details = usage.get("prompt_tokens_details") or {}
    return (
        int(usage.get("completion_tokens", chunks)),
        int(usage.get("prompt_tokens", 0)),
        int(details.get("cached_tokens") or 0),
    )


async def _read_stream(response: aiohttp.ClientResponse, started: float) -> _Reply:
    reply = _Reply()
    async for line in response.content:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            # Read to the end of the body as the OpenAI SDK does, so the connection is reused.
            await response.content.read()
            return reply
        event = orjson.loads(data)
        reply.id = reply.id or event.get("id")
        if "error" in event:
            # A failure after the first byte can only be reported in-band.
            error = event["error"]
            reply.error = str(error.get("message", error) if isinstance(error, dict) else error)
            continue
        for choice in event.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            # The first token is the first content, or the end of an answer that has none
            # (end of sequence drawn first): such a request is not left out of the TTFTs.
            if reply.ttft_s is None and (content or choice.get("finish_reason")):
                reply.ttft_s = time.perf_counter() - started
            if content:
                reply.text.append(content)
                reply.chunks += 1
        reply.usage = event.get("usage") or reply.usage
    # A relay that drops the end of a stream must not pass for a short answer.
    reply.error = reply.error or "the stream ended without data: [DONE]"
    return reply


async def _read_whole(response: aiohttp.ClientResponse) -> _Reply:
    body = orjson.loads(await response.read())
    reply = _Reply(usage=body.get("usage"), id=body.get("id"))
    for choice in body.get("choices") or ():
        content = (choice.get("message") or {}).get("content")
        if content:
            reply.text.append(content)
            reply.chunks += 1
    return reply


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    stream: bool,
    extra_headers: Mapping[str, str] | None = None,
) -> tuple[RequestResult, str]:
    """POST one chat completion (with ``extra_headers`` besides its content type); returns its
    result and the answer text. Never raises for a failed request: failures are results too."""
    started = time.perf_counter()
    replica = route = None
    sent = {"Content-Type": "application/json", **(extra_headers or {})}
    try:
        async with session.post(url, data=body, headers=sent) as response:
            replica = response.headers.get(headers.REPLICA)
            route = response.headers.get(headers.ROUTE)
            if response.status != 200:
                message = (await response.read())[:300].decode(errors="replace")
                return RequestResult(
                    response.status,
                    time.perf_counter() - started,
                    replica=replica,
                    route=route,
                    error=message,
                ), ""
            reply = await (_read_stream(response, started) if stream else _read_whole(response))
            status = response.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        # ValueError: a body that is not the JSON or SSE it claims to be (orjson's errors are
        # ValueErrors too), or an SSE line longer than aiohttp's line limit.
        error = f"{type(exc).__name__}: {exc}"
        return RequestResult(
            _NO_STATUS, time.perf_counter() - started, replica=replica, route=route, error=error
        ), ""
    output, prompt, cached = _usage_numbers(reply.usage, reply.chunks)
    result = RequestResult(
        status=status,
        latency_s=time.perf_counter() - started,
        ttft_s=reply.ttft_s,
        output_tokens=output,
        prompt_tokens=prompt,
        cached_tokens=cached,
        replica=replica or answered_by(reply.id),
        route=route,
        error=reply.error,
    )
    return result, "".join(reply.text)


def chat_body(spec: RequestSpec, model: str, *, stream: bool = True) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": list(spec.messages),
        "max_tokens": spec.max_tokens,
        "stream": stream,
    }
    if spec.tools:
        body["tools"] = list(spec.tools)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def _session(
    concurrency: int, timeout_s: float, headers: Mapping[str, str] | None = None
) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers=headers,
    )


async def run_conversations(
    base_url: str,
    workload: Sequence[Conversation],
    *,
    model: str,
    concurrency: int = 8,
    max_requests: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    start_interval_s: float = 0.0,
    arrivals: Sequence[float] | None = None,
    progress: bool = True,
    description: str = "requests",
    spread: Sequence[str] = (),
) -> RunResult:
    """Run every conversation's rounds in order, conversations concurrently, streaming.

    With ``spread`` (more base URLs), each request goes to one of ``base_url`` and those at
    random (seeded), as a load balancer spreads requests over several gateway instances.

    Conversation i starts ``i x start_interval_s`` after the run: users join over time, as
    in vLLM's multi-round QA benchmark, instead of all arriving in the same instant. With
    ``arrivals`` (one offset in seconds per conversation) it starts at ``arrivals[i]`` instead.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if arrivals is not None and len(arrivals) != len(workload):
        raise ValueError(f"{len(arrivals)} arrival times for {len(workload)} conversations")
    starts = (
        list(arrivals)
        if arrivals is not None
        else [i * start_interval_s for i in range(len(workload))]
    )
    planned = total_requests(workload)
    budget = planned if max_requests is None else min(planned, max_requests)
    url = base_url.rstrip("/") + CHAT_PATH
    urls = [url, *(u.rstrip("/") + CHAT_PATH for u in spread)]
    pick = random.Random(0).choice
    results: list[RequestResult] = []
    # The connector's limit would bound concurrency too, but a request's clock must start
    # when it gets a slot, not while it queues inside the client.
    slots = asyncio.Semaphore(concurrency)
    remaining = budget

    async def converse(
        index: int, conversation: Conversation, session: aiohttp.ClientSession, bar: tqdm[Any]
    ) -> None:
        nonlocal remaining
        # Against the run's clock, so a late start (a busy event loop) does not shift later ones.
        await asyncio.sleep(max(0.0, started + starts[index] - time.perf_counter()))
        answers: list[str] = []
        for round_ in range(conversation.rounds):
            if remaining <= 0:
                return
            remaining -= 1
            spec = conversation.request(round_, answers)
            async with slots:
                target = pick(urls) if spread else url
                result, answer = await send(session, target, chat_body(spec, model), stream=True)
            results.append(
                replace(
                    result,
                    conversation=spec.conversation,
                    group=spec.group,
                    round=spec.round,
                    messages=spec.messages,
                    tools=spec.tools,
                )
            )
            bar.update()
            if not result.ok:
                return  # the next round would need this answer
            answers.append(answer)

    started = time.perf_counter()
    with tqdm(total=budget, desc=description, unit="req", disable=not progress) as bar:
        async with _session(concurrency, timeout_s) as session:
            await asyncio.gather(*(converse(i, c, session, bar) for i, c in enumerate(workload)))
    return RunResult(tuple(results), time.perf_counter() - started, planned)


async def run_plain(
    base_url: str,
    body: Mapping[str, Any],
    *,
    requests: int,
    concurrency: int,
    stream: bool,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: bool = False,
    description: str = "requests",
    headers: Mapping[str, str] | None = None,
) -> RunResult:
    """Send ``requests`` copies of one chat body, ``concurrency`` at a time (``stream`` and,
    when streaming, include_usage are set here), with ``headers`` on each."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    payload = dict(body, stream=stream)
    if stream:
        payload["stream_options"] = {"include_usage": True}
    raw = orjson.dumps(payload)
    url = base_url.rstrip("/") + CHAT_PATH
    results: list[RequestResult] = []
    remaining = requests

    async def worker(session: aiohttp.ClientSession, bar: tqdm[Any]) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            result, _ = await send(session, url, raw, stream=stream)
            results.append(result)
            bar.update()

    started = time.perf_counter()
    with tqdm(total=requests, desc=description, unit="req", disable=not progress) as bar:
        async with _session(concurrency, timeout_s, headers) as session:
            workers = (worker(session, bar) for _ in range(min(concurrency, requests)))
            await asyncio.gather(*workers)
    return RunResult(tuple(results), time.perf_counter() - started, requests)
