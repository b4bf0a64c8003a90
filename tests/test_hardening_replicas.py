"""Issue 8, faulty replicas: streams retried before their first byte, passive health, honest
metrics, and compressed answers."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import struct
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai import APIError, AsyncOpenAI

from bench.host import rss_mib
from gateway import headers
from gateway.app_keys import MEMORY, POLICY
from gateway.routing.affinity import ReplicaRef
from replica.processes import ManagedProcess
from tests.conftest import (
    MODEL,
    Handler,
    answered,
    breaks_mid_stream,
    chat,
    eventually,
    fake_replica,
    get_text,
    gzips_its_stream,
    in_process_gateway,
    metric,
    pool_policy,
    running_gateway,
    running_sims,
)
from tests.hardening import FAST, Counted, beside_two_good, openai_error, wait_for_log


async def engine_dead(request: web.Request) -> web.Response:
    """A replica that answers 500 to everything."""
    return web.json_response({"error": {"message": "engine dead"}}, status=500)


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=10)


async def stream_text(url: str, user: str) -> str:
    stream = await client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": user}], stream=True, max_tokens=8
    )
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def dies_before_first_token(
    opening: bytes = b"",
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A replica's handler that answers 200, sends ``opening`` and dies before any token."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)  # 200 and headers sent
        if opening:
            await response.write(opening)
        assert request.transport is not None
        request.transport.close()  # the engine dies
        return response

    return handler


@contextlib.asynccontextmanager
async def beside_one_good(bad: Counted, path: str) -> AsyncIterator[ManagedProcess]:
    """A round-robin gateway over a fake replica answering ``path`` with ``bad``, first, and a
    good sim; failures never eject the fake."""
    async with (
        running_sims(1, **FAST) as [good],
        fake_replica(bad, path) as bad_url,
        running_gateway(
            [bad_url, good.url], "round-robin", env={"GATEWAY_OUTLIER_CONSECUTIVE_FAILURES": "100"}
        ) as gateway,
    ):
        yield gateway


async def test_a_stream_whose_replica_dies_before_the_first_token_is_retried() -> None:
    bad = Counted(dies_before_first_token())
    async with beside_one_good(bad, "/v1/chat/completions") as gw:
        texts = [await stream_text(gw.url, f"question {i}") for i in range(6)]
    assert all(texts), texts
    assert bad.hits >= 3  # round-robin sent every other first attempt there


async def test_a_responses_stream_whose_replica_dies_in_its_prefill_is_retried() -> None:
    # What vLLM sends as the request starts, before its prefill; then the engine dies.
    bad = Counted(dies_before_first_token(b'event: response.created\ndata: {"type":"x"}\n\n'))
    async with beside_one_good(bad, "/v1/responses") as gw:
        for i in range(4):
            stream = await client(gw.url).responses.create(
                model=MODEL, input=f"question {i}", max_output_tokens=4, stream=True
            )
            kinds = [event.type async for event in stream]
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert bad.hits >= 2  # round-robin sent every other first attempt there


async def test_a_responses_stream_cut_before_its_final_event_reaches_its_client_as_an_error() -> (
    None
):
    async def cut_after_a_token(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for kind in ("response.created", "response.in_progress", "response.output_text.delta"):
            await response.write(
                b'event: %s\ndata: {"type":"%s"}\n\n' % (kind.encode(), kind.encode())
            )
        await response.write_eof()  # a clean end, but no response.completed
        return response

    async with (
        fake_replica(cut_after_a_token, "/v1/responses") as bad_url,
        running_gateway([bad_url], "round-robin") as gw,
    ):
        stream = await client(gw.url).responses.create(model=MODEL, input="q", stream=True)
        with pytest.raises(APIError):
            _ = [event async for event in stream]


async def test_a_replica_answering_500_to_everything_is_ejected_and_logged() -> None:
    broken = Counted(engine_dead)

    async with beside_two_good(broken) as (gw, bad), aiohttp.ClientSession() as session:
        statuses = []
        for i in range(60):
            async with session.post(
                f"{gw.url}/v1/chat/completions", data=orjson.dumps(chat("s", f"q{i}"))
            ) as response:
                statuses.append(response.status)
        assert statuses == [200] * 60
        assert broken.hits == 5  # GATEWAY_OUTLIER_CONSECUTIVE_FAILURES, then no more
        _, text = await get_text(f"{gw.url}/metrics")
        assert metric(text, "gateway_replica_ejected", replica=bad) == 1.0
        assert metric(text, "gateway_replica_ejections_total", replica=bad) == 1.0
        assert metric(text, "gateway_retries_total", pool="small") == 5.0
        log = await wait_for_log(gw, "ejected")
        [line] = [line for line in log.splitlines() if "ejected for" in line]
        assert bad in line and "5 consecutive failures" in line


async def test_round_robin_turns_are_not_consumed_by_retries() -> None:
    broken = Counted(engine_dead)

    async with (
        beside_two_good(broken, {"GATEWAY_OUTLIER_CONSECUTIVE_FAILURES": "1000"}) as (gw, _),
        aiohttp.ClientSession() as session,
    ):
        served: Counter[str] = Counter()
        for i in range(30):
            async with session.post(
                f"{gw.url}/v1/chat/completions", data=orjson.dumps(chat("s", f"q{i}"))
            ) as response:
                assert response.status == 200
                served[response.headers[headers.REPLICA]] += 1
        assert broken.hits == 10  # one turn in three, not every request's first attempt
        assert sorted(served.values()) == [15, 15]


async def test_a_silent_replica_costs_a_stream_the_first_token_timeout_then_is_ejected() -> None:
    async def silent(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)  # past every timeout the test sets
        return web.Response()

    async with (
        running_sims(1, **FAST) as [good],
        fake_replica(silent) as bad_url,
        running_gateway(
            [bad_url, good.url],
            "round-robin",
            env={
                "GATEWAY_FIRST_TOKEN_TIMEOUT_S": "0.5",
                "GATEWAY_OUTLIER_CONSECUTIVE_FAILURES": "2",
            },
        ) as gw,
    ):
        loop = asyncio.get_running_loop()
        started = loop.time()
        texts = [await stream_text(gw.url, f"q{i}") for i in range(8)]
        assert all(texts)
        assert loop.time() - started < 4  # two timeouts of 0.5 s, then the replica is out
        _, text = await get_text(f"{gw.url}/metrics")
        assert metric(text, "gateway_replica_ejected", replica=bad_url.removeprefix("http://")) == 1


async def test_a_non_streaming_answer_past_its_timeout_is_504_stopped_and_not_retried() -> None:
    # vLLM sends a whole answer after its last token: a slow one is most likely still being
    # generated, which another replica would take as long to do again.
    stopped: list[bool] = []

    async def generating(request: web.Request) -> web.StreamResponse:
        for _ in range(100):  # 5 s, past the timeout the test sets
            await asyncio.sleep(0.05)
            if request.transport is None or request.transport.is_closing():
                stopped.append(True)  # the gateway closed the connection: vLLM aborts
                break
        return web.json_response({})

    env = {"GATEWAY_ANSWER_TIMEOUT_S": "0.3", "GATEWAY_OUTLIER_CONSECUTIVE_FAILURES": "2"}
    async with (
        beside_two_good(slow := Counted(generating), env) as (gw, slow_name),
        aiohttp.ClientSession() as session,
    ):
        answers = []
        for i in range(6):
            body = orjson.dumps(chat("s", f"q{i}"))
            async with session.post(f"{gw.url}/v1/chat/completions", data=body) as response:
                answers.append((response.status, response.headers[headers.REPLICA]))
                if response.status == 504:
                    assert openai_error(await response.read())["code"] == "response_timeout"
        _, text = await get_text(f"{gw.url}/metrics")
        assert await eventually(lambda: len(stopped) == slow.hits)
    assert answers.count((504, slow_name)) == slow.hits == 2  # once in three, each tried once
    assert [status for status, _ in answers].count(200) == 4
    # Slow is not broken: two in a row would have ejected it.
    assert metric(text, "gateway_replica_ejected", replica=slow_name) == 0
    assert metric(text, "gateway_retries_total", pool="small") is None
    assert metric(text, "gateway_requests_total", pool="small", code="504") == 2


async def test_a_5xx_whose_body_stalls_is_given_up_on_closed_and_retried() -> None:
    # An error body comes whole with its head: one that does not is not worth the wait (the
    # silence allowed between two chunks is 600 s), nor a connection left open.
    closed: list[bool] = []

    async def stalls(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=500, headers={"Content-Type": "application/json"})
        response.content_length = 100
        await response.prepare(request)
        await response.write(b'{"error": ')
        for _ in range(200):  # 10 s
            await asyncio.sleep(0.05)
            if request.transport is None or request.transport.is_closing():
                closed.append(True)
                break
        return response

    async with (
        beside_two_good(staller := Counted(stalls)) as (gw, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=8)) as session,
    ):
        body = orjson.dumps(chat("s", "q"))
        async with session.post(f"{gw.url}/v1/chat/completions", data=body) as response:
            assert response.status == 200  # from a good replica
        assert staller.hits == 1
        assert await eventually(lambda: closed == [True])


def answers_24_mb(replied: list[bool]) -> Handler:
    """A replica's chat handler answering a 24 MiB completion at once, noting each in ``replied``
    (more than the socket buffers take from a client that reads nothing)."""

    async def handler(request: web.Request) -> web.Response:
        replied.append(True)
        big = {"id": "x", "object": "chat.completion", "created": 0, "model": MODEL, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "x" * (24 << 20)},
             "finish_reason": "length"}]}  # fmt: skip
        return web.json_response(big)

    return handler


@contextlib.contextmanager
def reading_nothing(url: str, chunked: bool = False) -> Iterator[socket.socket]:
    """A connection to ``url`` that sends a chat request (its body chunked, which aiohttp serves,
    or with its length, which the front does) and reads nothing of the answer."""
    body = orjson.dumps(chat("s", "q"))
    if chunked:
        framed = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        framed = b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n" + framed
        )
        yield sock


async def test_a_client_that_leaves_while_its_whole_answer_is_written_is_counted_499() -> None:
    replied: list[bool] = []
    env = {"GATEWAY_MAX_BUFFERED_ANSWER_BYTES": str(32 << 20)}  # held whole, sent in one write
    async with fake_replica(answers_24_mb(replied)) as url, running_gateway([url], env=env) as gw:
        with reading_nothing(gw.url) as sock:
            assert await eventually(lambda: replied == [True])
            await asyncio.sleep(0.5)  # the answer is in the gateway's socket, waiting
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        assert await eventually(lambda: answered(gw.url, "499"))
        _, text = await get_text(f"{gw.url}/metrics")
        assert metric(text, "gateway_requests_total", pool="small", code="200") is None


@pytest.mark.parametrize("chunked", [False, True], ids=["the-fronts", "aiohttps"])
async def test_a_client_that_reads_nothing_of_its_whole_answer_is_gone_after_the_send_timeout(
    chunked: bool,
) -> None:
    env = {"GATEWAY_MAX_BUFFERED_ANSWER_BYTES": str(32 << 20), "GATEWAY_SEND_TIMEOUT_S": "1"}
    async with fake_replica(answers_24_mb([])) as url, running_gateway([url], env=env) as gw:
        with reading_nothing(gw.url, chunked):
            assert await eventually(lambda: answered(gw.url, "499"))


async def test_a_client_that_leaves_a_non_streaming_request_is_counted_499() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.json_response({})

    async with fake_replica(slow) as url, running_gateway([url]) as gw:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as session:
            try:
                await session.post(
                    f"{gw.url}/v1/chat/completions", data=orjson.dumps(chat("s", "q"))
                )
            except TimeoutError:
                pass

        assert await eventually(lambda: answered(gw.url, "499"))
        # It was routed before its client left: counted under its route, not "none".
        _, text = await get_text(f"{gw.url}/metrics")
        assert metric(text, "gateway_requests_total", route="none", code="499") is None


async def test_a_stream_that_ends_in_an_error_event_is_counted_502() -> None:
    async with fake_replica(breaks_mid_stream) as url, running_gateway([url]) as gw:
        try:
            await stream_text(gw.url, "q")
            raise AssertionError("the stream should have raised")
        except APIError:
            pass
        _, text = await get_text(f"{gw.url}/metrics")
        assert metric(text, "gateway_requests_total", pool="small", code="502") == 1.0
        assert metric(text, "gateway_requests_total", pool="small", code="200") is None


async def test_a_compressed_answer_reaches_the_openai_client_decodable() -> None:
    seen_encodings: list[str] = []
    answer = {
        "id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "zipped"},
                     "finish_reason": "stop"}],
    }  # fmt: skip

    async def gzips_anyway(request: web.Request) -> web.Response:
        seen_encodings.append(request.headers.get("Accept-Encoding", ""))
        return web.Response(
            body=gzip.compress(orjson.dumps(answer)),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )

    async with fake_replica(gzips_anyway) as url, running_gateway([url]) as gw:
        completion = await client(gw.url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        assert completion.choices[0].message.content == "zipped"
    assert seen_encodings == ["identity"]  # the gateway asks for plain bytes


async def test_a_compressed_answer_to_a_stored_responses_lookup_keeps_its_encoding() -> None:
    cancelled = {"id": "resp_1", "object": "response", "status": "cancelled"}

    async def gzips_anyway(request: web.Request) -> web.Response:
        return web.Response(
            body=gzip.compress(orjson.dumps(cancelled)),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )

    async with (
        fake_replica(gzips_anyway, "/v1/responses/resp_1/cancel") as url,
        in_process_gateway(pool_policy([url], "round-robin")) as gateway,
    ):
        app = gateway.app
        assert app is not None
        [replica] = app[POLICY].fleet.pools["small"].replicas.values()
        app[MEMORY].responses.remember("resp_1", ReplicaRef("small", replica.name, None))
        response = await gateway.post("/v1/responses/resp_1/cancel")
        assert response.headers.get("Content-Encoding") == "gzip"
        assert await response.json() == cancelled  # decoded, as its header says


async def test_a_background_stream_is_not_run_again_elsewhere_while_its_first_token_waits() -> None:
    """vLLM runs a background response as work of its own, which a closed connection does not
    stop: held back for its first token and retried, it would be generated twice (and its id,
    which the client never saw, left running)."""
    posted: list[str] = []
    prefilled = asyncio.Event()

    async def queued_then_slow(request: web.Request) -> web.StreamResponse:
        posted.append(request.host)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        created = b'{"type":"response.created","response":{"id":"resp_bg","status":"queued"}}'
        await response.write(b"event: response.created\ndata: %s\n\n" % created)
        await prefilled.wait()  # its prefill waits in a long queue
        return response

    body = {"model": MODEL, "input": "q", "background": True, "stream": True}
    async with (
        fake_replica(queued_then_slow, "/v1/responses") as first,
        fake_replica(queued_then_slow, "/v1/responses") as second,
        in_process_gateway(pool_policy([first, second]), first_token_timeout_s=0.5) as gateway,
    ):
        try:
            async with asyncio.timeout(5):
                answer = await gateway.post("/v1/responses", data=orjson.dumps(body))
                assert answer.status == 200
                assert b"response.created" in await answer.content.readuntil(b"\n\n")
            answer.close()
        finally:
            prefilled.set()
    assert len(posted) == 1


async def test_a_compressed_stream_reaches_the_openai_client_whole_and_counts_as_a_success() -> (
    None
):
    # No event can be read inside compressed bytes: the gateway relays them as they come and
    # takes a clean end for the end, rather than appending an error event to them.
    async with fake_replica(gzips_its_stream()) as url, running_gateway([url]) as gw:
        assert await stream_text(gw.url, "hi") == "zipped stream"
        _, text = await get_text(f"{gw.url}/metrics")
    assert metric(text, "gateway_requests_total", pool="small", code="200") == 1.0
    assert metric(text, "gateway_requests_total", pool="small", code="502") is None


async def test_a_compressed_stream_goes_out_as_it_comes_not_held_for_events() -> None:
    # The usage event the gateway asks for cannot be found in compressed bytes: nothing is
    # held back looking for it (the first token would wait for the whole stream).
    more = asyncio.Event()
    body = orjson.dumps(chat("s", "hi", stream=True))  # no include_usage: the gateway asks
    async with (
        fake_replica(gzips_its_stream(more)) as url,
        running_gateway([url]) as gw,
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(f"{gw.url}/v1/chat/completions", data=body) as response,
    ):
        async with asyncio.timeout(5):
            first = await response.content.readany()  # while the replica holds the rest
        more.set()
        rest = await response.read()
    # The first event came while the replica held the rest; all of it, whole, after.
    assert b'"zipped "' in zlib.decompressobj(wbits=31).decompress(first)
    assert zlib.decompress(first + rest, wbits=31).endswith(b"data: [DONE]\n\n")


HUGE_MB = 300
HEAD = (
    b'{"id":"chatcmpl-huge","object":"chat.completion","created":0,"model":"sim-model",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"'
)
TAIL = (
    b'"},"finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
)
HUGE_SIZE = len(HEAD) + HUGE_MB * (1 << 20) + len(TAIL)
RSS_BOUND_MIB = 64.0
"""What two concurrent 300 MB answers may add to the gateway's resident memory (its limit
holds 4 MiB of each; the rest is the relay's buffers)."""


async def answers_300_mb(request: web.Request) -> web.StreamResponse:
    """A runaway replica: a well-formed chat completion of 300 MB, written 1 MB at a time."""
    filler = b"x" * (1 << 20)
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = HUGE_SIZE
    await response.prepare(request)
    await response.write(HEAD)
    for _ in range(HUGE_MB):
        await response.write(filler)
    await response.write(TAIL)
    await response.write_eof()
    return response


async def test_two_300_mb_answers_at_once_reach_their_clients_whole_in_bounded_memory() -> None:
    async with fake_replica(answers_300_mb) as url, running_gateway([url]) as gateway:
        before = peak = rss_mib(gateway.pid)

        async def fetch() -> tuple[int, str | None, int, bytes]:
            size, end = 0, b""
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{gateway.url}/v1/chat/completions", json=chat("", "hi")) as answer,
            ):
                async for chunk in answer.content.iter_any():
                    size += len(chunk)
                    end = (end + chunk)[-len(TAIL) :]
                return answer.status, answer.headers.get("Content-Length"), size, end

        fetches = asyncio.gather(fetch(), fetch())
        while not fetches.done():
            peak = max(peak, rss_mib(gateway.pid))
            await asyncio.sleep(0.01)
        answers = await fetches
    for status, length, size, end in answers:
        assert (status, length, size, end) == (200, str(HUGE_SIZE), HUGE_SIZE, TAIL)
    assert peak - before < RSS_BOUND_MIB, f"{peak - before:.0f} MiB more"


async def test_a_replicas_huge_error_answer_becomes_the_gateways_own_short_error() -> None:
    async def huge_error(request: web.Request) -> web.Response:
        message = "busy " * (1 << 20)
        return web.json_response({"error": {"message": message}}, status=503)

    # One replica: its answer is a failed attempt kept for the client, as no other can retry.
    async with (
        fake_replica(huge_error) as url,
        running_gateway([url]) as gateway,
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/v1/chat/completions", json=chat("", "hi")) as answer,
    ):
        body = await answer.read()
    assert answer.status == 503 and len(body) < 1024
    error = orjson.loads(body)["error"]
    assert error["code"] == "upstream_error" and "could not be relayed" in error["message"]


async def html_page(request: web.Request) -> web.Response:
    """What a proxy in front of a dead engine answers: 200, an HTML page."""
    return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")


async def ends_without_done(request: web.Request) -> web.StreamResponse:
    """A stream that closes cleanly after one chunk, without its `data: [DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
             "choices": [{"index": 0, "delta": {"content": "partial "}, "finish_reason": None}]}  # fmt: skip
    await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await response.write_eof()
    return response


async def test_an_html_answer_is_a_failure_retried_elsewhere_and_its_replica_ejected() -> None:
    bad = Counted(html_page)
    async with beside_two_good(bad) as (gw, bad_name):
        answers = [
            await client(gw.url).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2
            )
            for i in range(30)
        ]
        _, text = await get_text(f"{gw.url}/metrics")
    assert all(a.object == "chat.completion" for a in answers)  # every one retried
    assert bad.hits == 5  # GATEWAY_OUTLIER_CONSECUTIVE_FAILURES, then ejected
    assert metric(text, "gateway_replica_ejected", replica=bad_name) == 1.0


async def test_only_html_answers_give_the_client_a_502_naming_them() -> None:
    async with (
        fake_replica(html_page) as url,
        running_gateway([url]) as gateway,
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/v1/chat/completions", json=chat("", "hi")) as answer,
    ):
        error = (await answer.json())["error"]
    assert answer.status == 502 and "text/html" in error["message"]


async def test_a_stream_ending_without_done_ends_in_an_error_event_and_ejects_its_replica() -> None:
    bad = Counted(ends_without_done)
    async with beside_two_good(bad) as (gw, bad_name):
        failed = 0
        for i in range(30):
            try:
                await stream_text(gw.url, f"q{i}")
            except APIError:
                failed += 1
        _, text = await get_text(f"{gw.url}/metrics")
    assert failed == bad.hits == 5  # each cut stream reached its client as an error
    assert metric(text, "gateway_requests_total", pool="small", code="502") == 5.0
    assert metric(text, "gateway_replica_ejected", replica=bad_name) == 1.0
