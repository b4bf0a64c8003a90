"""The benchmark client's time to first token, read from streams shaped as vLLM sends them."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.driver import send

ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}


def _token(text: str, finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def _streaming(events: list[dict[str, object]], pause_s: float) -> web.Application:
    """A replica that sends the role chunk at once, then ``events`` after ``pause_s``."""

    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + orjson.dumps(ROLE) + b"\n\n")
        await asyncio.sleep(pause_s)
        for event in events:
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _ttft(events: list[dict[str, object]], pause_s: float) -> float | None:
    async with TestServer(_streaming(events, pause_s), host="127.0.0.1") as server:
        async with aiohttp.ClientSession() as session:
            result, _ = await send(
                session, str(server.make_url("/v1/chat/completions")), b"{}", stream=True
            )
    assert result.ok
    return result.ttft_s


async def test_the_role_chunk_is_not_the_first_token() -> None:
    ttft = await _ttft([_token("Hi"), _token(" there", "length")], pause_s=0.2)
    assert ttft is not None and ttft >= 0.2


async def test_an_answer_with_no_content_counts_from_its_end() -> None:
    # End of sequence drawn first: one chunk with a finish reason and no text.
    ttft = await _ttft([_token("", "stop")], pause_s=0.2)
    assert ttft is not None and ttft >= 0.2
