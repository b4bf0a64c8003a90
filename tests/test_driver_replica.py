"""Which replica answered, as the benchmark client reads it: the gateway's x-gateway-replica
header, else a simulated replica's response id, which names it through any router."""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest

from bench.driver import answered_by, send
from tests.conftest import MODEL, running_sims


@pytest.mark.parametrize("stream", [False, True])
async def test_a_sims_answer_names_it_without_a_gateway_header(stream: bool) -> None:
    body = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
         "stream": stream}
    )  # fmt: skip
    async with running_sims(2) as sims, aiohttp.ClientSession() as session:
        for sim in sims:
            result, _ = await send(session, f"{sim.url}/v1/chat/completions", body, stream=stream)
            assert result.ok, result.error
            assert result.replica == f"sim:{urlsplit(sim.url).port}"


def test_only_a_sims_own_id_names_a_replica() -> None:
    assert answered_by("chatcmpl-8001-" + "0f" * 16) == "sim:8001"
    assert answered_by("cmpl-8001-" + "0f" * 16) == "sim:8001"
    assert answered_by("chatcmpl-" + "0f" * 16) is None  # vLLM's own: no replica in it
    assert answered_by("chatcmpl-req-42") is None  # the caller's request id, as vLLM echoes it
    assert answered_by(None) is None
