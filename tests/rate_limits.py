"""Shared helpers of the rate-limit tests: two tenants' API keys, a chat's messages, a tenant's
entry of the policy's `limits:` section, and a one-pool policy with that section."""

from __future__ import annotations

from typing import Any

import aiohttp
from openai.types.chat import ChatCompletionMessageParam

from gateway import headers
from gateway.rate_limit import hash_key
from tests.conftest import pool_policy

ACME_KEY = "sk-acme-0123456789"
GLOBEX_KEY = "sk-globex-9876543210"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Where is my parcel?"}]


def tenant(key: str, **limits: int) -> dict[str, Any]:
    return {"api_key_sha256": [hash_key(key)], **limits}


def limited_policy(urls: list[str], **limits_section: Any) -> dict[str, Any]:
    return {**pool_policy(urls), "limits": limits_section}


async def lookups_need_a_key(anonymous: aiohttp.ClientSession, response_id: str) -> None:
    """A stored response's retrieve and cancel without a tenant's key: 401, never relayed."""
    for method, path in (
        ("GET", f"/v1/responses/{response_id}"),
        ("POST", f"/v1/responses/{response_id}/cancel"),
    ):
        async with anonymous.request(method, path) as refused:
            assert refused.status == 401
            assert (await refused.json())["error"]["code"] == "invalid_api_key"
            assert headers.REPLICA not in refused.headers  # never relayed
