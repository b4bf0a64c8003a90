"""Bad input gets an OpenAI error body and the right status; never a stack trace or a hang."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gateway import headers
from replica.processes import free_port
from tests.conftest import MODEL, GatewayClient, in_process_gateway, in_process_sims
from tests.hardening import openai_error, read_answer

pytestmark = pytest.mark.asyncio(loop_scope="module")

BODY_LIMIT = 4096


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway() -> AsyncIterator[GatewayClient]:
    dead = f"http://127.0.0.1:{free_port()}"
    async with in_process_sims(1) as [replica]:
        policy = {
            "pools": {
                "small": {"model": MODEL, "replicas": [replica]},
                "down": {"model": "nobody-home", "replicas": [dead]},
            }
        }
        async with in_process_gateway(policy, max_body_bytes=BODY_LIMIT) as client:
            yield client


async def post(client: GatewayClient, path: str, data: bytes) -> tuple[int, dict[str, Any], str]:
    async with client.post(
        path, data=data, headers={"Content-Type": "application/json"}
    ) as response:
        body = await response.json(content_type=None)
        return response.status, body, response.headers.get(headers.REQUEST_ID, "")


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

# fmt: off
CASES = [
    ("invalid JSON", CHAT, b'{"model": "sim-model", "messages": [', 400, None),
    ("a JSON array, not an object", CHAT, b"[1, 2]", 400, None),
    ("no model", CHAT, b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "model"),
    ("no messages", CHAT, b'{"model": "sim-model"}', 400, "messages"),
    ("empty messages", CHAT, b'{"model": "sim-model", "messages": []}', 400, "messages"),
    ("a message without a role", CHAT, b'{"model": "sim-model", "messages": [{"content": "hi"}]}', 400, "messages[0]"),
    ("content of the wrong type", CHAT, b'{"model": "sim-model", "messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content"),
    ("stream not a boolean", CHAT, b'{"model": "sim-model", "stream": "yes", "messages": [{"role": "user", "content": "hi"}]}', 400, "stream"),
    ("no prompt", COMPLETIONS, b'{"model": "sim-model"}', 400, "prompt"),
    ("a prompt of the wrong type", COMPLETIONS, b'{"model": "sim-model", "prompt": {"a": 1}}', 400, "prompt"),
    ("unknown model", CHAT, b'{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}', 404, "model"),
    ("a pool with no healthy replica", CHAT, b'{"model": "nobody-home", "messages": [{"role": "user", "content": "hi"}]}', 503, None),
    ("max_tokens 0 on chat, which vLLM refuses", CHAT, b'{"model": "sim-model", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}', 400, "max_tokens"),
]
# fmt: on


@pytest.mark.parametrize(("case", "path", "data", "status", "param"), CASES)
async def test_bad_requests_get_openai_errors(
    gateway: GatewayClient, case: str, path: str, data: bytes, status: int, param: str | None
) -> None:
    got, body, request_id = await post(gateway, path, data)
    assert got == status, case
    assert set(body["error"]) == {"message", "type", "param", "code"}, case
    assert body["error"]["message"], case
    assert body["error"]["param"] == param, case
    assert request_id, case


async def test_a_completion_of_0_tokens_scoring_its_prompt_is_left_to_the_replica(
    gateway: GatewayClient,
) -> None:
    scoring = {
        "model": MODEL,
        "prompt": "hello world",
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
    }
    async with gateway.post(COMPLETIONS, json=scoring) as response:
        assert headers.REPLICA in response.headers  # vLLM answers it (200), not the gateway


async def test_unknown_model_has_the_model_not_found_code(gateway: GatewayClient) -> None:
    _, body, _ = await post(gateway, CHAT, CASES[10][2])
    assert body["error"]["code"] == "model_not_found"


async def test_a_body_over_the_limit_is_413(gateway: GatewayClient) -> None:
    big = b'{"model": "sim-model", "prompt": "' + b"x" * BODY_LIMIT + b'"}'
    status, body, _ = await post(gateway, COMPLETIONS, big)
    assert status == 413
    assert body["error"]["code"] == "request_too_large"


async def test_a_body_over_the_limit_closes_its_connection_so_the_next_request_is_not_lost(
    gateway: GatewayClient,
) -> None:
    # Kept alive, the rest of the refused body would jam the connection's parser: the next
    # request on it would go unanswered until the keep-alive timer closed it.
    reader, writer = await asyncio.open_connection(gateway.host, gateway.port)
    big = b'{"model": "sim-model", "prompt": "' + b"x" * (20 * BODY_LIMIT) + b'"}'
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (COMPLETIONS.encode(), len(big), big)
    )
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    async with asyncio.timeout(5):
        got, fields, body = await read_answer(reader)
        assert (got, openai_error(body)["code"]) == (413, "request_too_large")
        assert fields.get("connection", "").lower() == "close"
        assert await reader.read() == b""  # closed, not left waiting: the client retries anew
    writer.close()


@pytest.mark.parametrize(
    ("method", "path", "expect", "length", "status", "code"),
    [
        (b"POST", CHAT, b"100-continue", BODY_LIMIT + 1, 413, "request_too_large"),
        (b"POST", CHAT, b"tea", 2, 417, "expectation_failed"),
        (b"GET", "/v1/models", b"tea", 0, 417, "expectation_failed"),
        (b"GET", "/v1/responses/resp_1", b"tea", 0, 417, "expectation_failed"),
    ],
    ids=["continue-over-the-limit", "unsupported", "unsupported-on-a-get", "on-a-lookup"],
)
async def test_an_expectation_refused_is_answered_at_once_with_an_openai_error_and_a_close(
    gateway: GatewayClient,
    method: bytes,
    path: str,
    expect: bytes,
    length: int,
    status: int,
    code: str,
) -> None:
    # A body over the limit is refused before the client sends it, not invited by a 100.
    reader, writer = await asyncio.open_connection(gateway.host, gateway.port)
    writer.write(
        b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nExpect: %s\r\nX-Request-Id: expecting-1\r\n\r\n"
        % (method, path.encode(), length, expect)
    )
    async with asyncio.timeout(5):
        got, fields, body = await read_answer(reader)
        # The body it announced is not coming: the connection closes, rather than read the
        # client's next request as that body.
        assert fields.get("connection", "").lower() == "close"
        assert await reader.read() == b""
    writer.close()
    assert got == status
    assert openai_error(body)["code"] == code
    assert fields[headers.REQUEST_ID.lower()] == "expecting-1"


async def test_unknown_paths_and_methods_are_openai_errors(gateway: GatewayClient) -> None:
    async with gateway.get("/v1/nothing-here") as response:
        assert response.status == 404
        assert "error" in await response.json()
    async with gateway.get(CHAT) as response:
        assert response.status == 405
        assert "error" in await response.json()


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("DELETE", "/v1/models", {"GET", "HEAD"}), ("GET", CHAT, {"POST"})],
)
async def test_a_method_the_path_does_not_take_gets_a_405_naming_those_it_does(
    gateway: GatewayClient, method: str, path: str, allowed: set[str]
) -> None:
    async with gateway.request(method, path) as response:
        assert response.status == 405
        assert {m.strip() for m in response.headers["Allow"].split(",")} == allowed
        assert (await response.json())["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("path", "prompt"),
    [(CHAT, b'"messages": [{"role": "user", "content": "hi"}]'), (COMPLETIONS, b'"prompt": "hi"')],
)
async def test_a_null_stream_is_answered_whole_as_vllm_reads_it(
    gateway: GatewayClient, path: str, prompt: bytes
) -> None:
    # vLLM declares `stream: Optional[bool] = False`, as OpenAI does: null is not an error.
    data = b'{"model": "sim-model", "stream": null, "max_tokens": 2, ' + prompt + b"}"
    async with gateway.post(path, data=data) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "application/json"
        answer = await response.json()
    assert answer["object"] in ("chat.completion", "text_completion")
    assert answer["usage"]["completion_tokens"] == 2


async def test_ready_names_the_pool_without_replicas(gateway: GatewayClient) -> None:
    async with gateway.get("/ready") as response:
        assert response.status == 503
        assert (await response.json())["healthy_replicas"] == {"small": 1, "down": 0}
    # The chart's probe: ready while a pool can serve, the pods serving the others meanwhile.
    async with gateway.get("/ready?pools=any") as response:
        assert response.status == 200
        assert (await response.json())["healthy_replicas"] == {"small": 1, "down": 0}


async def test_a_body_with_a_byte_order_mark_is_read_as_vllm_reads_it(
    gateway: GatewayClient,
) -> None:
    data = b'\xef\xbb\xbf{"model": "sim-model", "max_tokens": 2, "prompt": "hi"}'
    async with gateway.post(COMPLETIONS, data=data) as response:
        assert response.status == 200, await response.text()
