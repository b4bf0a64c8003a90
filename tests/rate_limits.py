"""Shared helpers of the rate-limit tests: two tenants' API keys, a chat's messages, a tenant's
entry of the policy's `limits:` section, and a one-pool policy with that section."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionMessageParam

from gateway.rate_limit import hash_key
from tests.conftest import pool_policy

ACME_KEY = "sk-acme-0123456789"
GLOBEX_KEY = "sk-globex-9876543210"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Where is my parcel?"}]


def tenant(key: str, **limits: int) -> dict[str, Any]:
    return {"api_key_sha256": [hash_key(key)], **limits}


def limited_policy(urls: list[str], **limits_section: Any) -> dict[str, Any]:
    return {**pool_policy(urls), "limits": limits_section}
