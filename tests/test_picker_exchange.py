"""The picker's side of one ext_proc stream, with Envoy played by a script: what the picker
learns from the answer Envoy relays must not hang on Envoy reading the picker's answers."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from gateway.picker.exchange import Envoy, PickerExchange
from gateway.routing.routed import CLIENT_CLOSED


class ClosingEnvoy:
    """Envoy sending ``messages``, then closing the stream as soon as it has the answer to the
    last one (the write of that answer is cancelled, as gRPC cancels it when Envoy hangs up)."""

    def __init__(self, messages: list[Any], *, closes_on_last: bool = True) -> None:
        self._messages = list(messages)
        self._closes_on_last = closes_on_last
        self.answered = 0

    async def read(self) -> Any | None:
        return self._messages.pop(0) if self._messages else None

    async def write(self, response: Any) -> None:
        if not self._messages and self._closes_on_last:
            raise asyncio.CancelledError
        self.answered += 1


def answer_headers(status: int) -> Any:
    values = [core.HeaderValue(key=":status", raw_value=str(status).encode())]
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=core.HeaderMap(headers=values))
    )


def chunk(body: bytes, *, last: bool = False) -> Any:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=last))


async def follow(envoy: ClosingEnvoy) -> tuple[list[bytes], list[int]]:
    """What the picker was told: the chunks, and how the answer ended."""
    chunks: list[bytes] = []
    ends: list[int] = []
    exchange = PickerExchange(cast(Envoy, envoy), b"{}")
    try:
        await exchange.follow(lambda *_: {}, chunks.append, ends.append)
    except asyncio.CancelledError:
        pass
    return chunks, ends


async def test_the_last_chunk_and_the_end_are_taken_in_though_envoy_closes_on_its_answer() -> None:
    envoy = ClosingEnvoy(
        [answer_headers(200), chunk(b"data: 1\n\n"), chunk(b'data: {"usage": 1}\n\n', last=True)]
    )
    chunks, ends = await follow(envoy)
    assert chunks == [b"data: 1\n\n", b'data: {"usage": 1}\n\n']
    assert ends == [200]


async def test_an_answer_without_a_body_ends_with_its_headers_though_envoy_closes() -> None:
    headers_only = answer_headers(204)
    headers_only.response_headers.end_of_stream = True
    _, ends = await follow(ClosingEnvoy([headers_only]))
    assert ends == [204]


async def test_a_stream_that_ends_before_the_answer_does_is_a_client_that_left() -> None:
    envoy = ClosingEnvoy([answer_headers(200), chunk(b"data: 1\n\n")], closes_on_last=False)
    chunks, ends = await follow(envoy)
    assert chunks == [b"data: 1\n\n"]
    assert ends == [CLIENT_CLOSED]
    assert envoy.answered == 2  # every message Envoy sent was answered
