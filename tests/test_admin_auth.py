"""Who may use /admin/*: the configured bearer token, sent as clients and secret stores send it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from replica.processes import free_port
from tests.conftest import MODEL, GatewayClient, in_process_gateway
from tests.hardening import openai_error, raw_http

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "adm1n-token"


def policy() -> dict[str, Any]:
    # /admin/policy answers from the policy alone: no replica needs to be up.
    return {"pools": {"small": {"model": MODEL, "replicas": [f"http://127.0.0.1:{free_port()}"]}}}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway() -> AsyncIterator[GatewayClient]:
    async with in_process_gateway(policy(), admin_token=TOKEN) as client:
        yield client


async def admin_status(client: GatewayClient, authorization: str) -> int:
    async with client.get("/admin/policy", headers={"Authorization": authorization}) as response:
        return response.status


async def test_a_token_stored_with_a_final_newline_accepts_the_token() -> None:
    # What `kubectl create secret --from-file` makes of a file whose last line ends as usual.
    async with in_process_gateway(policy(), admin_token=f"{TOKEN}\n") as client:
        assert await admin_status(client, f"Bearer {TOKEN}") == 200
        assert await admin_status(client, f"Bearer {TOKEN}x") == 401


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_the_bearer_scheme_is_case_insensitive(gateway: GatewayClient, scheme: str) -> None:
    assert await admin_status(gateway, f"{scheme} {TOKEN}") == 200


@pytest.mark.parametrize(
    "authorization",
    [TOKEN, f"Basic {TOKEN}", f"Bearer{TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN} x", "Bearer"],
)
async def test_the_token_counts_only_after_a_bearer_scheme(
    gateway: GatewayClient, authorization: str
) -> None:
    assert await admin_status(gateway, authorization) == 401


@pytest.mark.parametrize(
    "authorization", [b"Bearer \xff\xfe", b"Bearer adm1n-tok\xc3\xa9", b"\xff", b"B\xe9arer x"]
)
@pytest.mark.parametrize(("method", "path"), [("GET", "/admin/policy"), ("POST", "/admin/reload")])
async def test_non_ascii_bytes_in_the_header_get_401_not_500(
    gateway: GatewayClient, method: str, path: str, authorization: bytes
) -> None:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n"
    request = head.encode() + b"Authorization: " + authorization + b"\r\n\r\n"
    status, _, body = await raw_http(str(gateway.make_url("")), request)
    assert status == 401
    assert openai_error(body)["code"] == "invalid_admin_token"
