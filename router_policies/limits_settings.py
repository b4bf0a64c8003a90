"""Policy-file section ``limits``: tenants, their API keys (as hashes) and their request and
token rates (router_policies/rate_limit.py, gateway/rate_limit/); defaults with their reasons."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from router_policies.strict_model import StrictModel
from router_policies.yaml_locations import error_at

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_MOST_PER_MINUTE = 10**12
"""A trillion a minute is beyond any fleet; the buckets count in floats (here and in Redis's
Lua), which stay exact to well under a token at twice this and overflow at a far larger int."""


class TenantLimits(StrictModel):
    """One tenant: its API keys (as hashes) and its limits (unset: not limited on that axis)."""

    api_key_sha256: Annotated[list[str], Field(min_length=1)]
    """sha256 hex digests of the tenant's API keys, never the keys (`llm-gateway hash-key`)."""
    requests_per_minute: Annotated[int, Field(ge=1, le=_MOST_PER_MINUTE)] | None = None
    tokens_per_minute: Annotated[int, Field(ge=1, le=_MOST_PER_MINUTE)] | None = None
    """Prompt tokens (estimated from its bytes) + max_tokens, corrected by the usage the
    replica reports once the request ends."""

    @field_validator("api_key_sha256")
    @classmethod
    def _hashes(cls, hashes: list[str]) -> list[str]:
        cleaned = [h.strip().lower() for h in hashes]
        for i, digest in enumerate(cleaned):
            if not _SHA256_HEX.fullmatch(digest):
                # The value is not echoed: it may be a key pasted in clear.
                raise ValueError(
                    f"entry {i} is not a sha256 hex digest (64 hex digits); make one with "
                    "`llm-gateway hash-key`, never put the key itself here"
                )
        if len(set(cleaned)) != len(cleaned):
            raise ValueError("a key hash is listed twice")
        return cleaned


class LimitsSettings(StrictModel):
    """Per-API-key rate limits. With tenants listed, the gateway authenticates clients by
    their bearer key; with none (the default), it checks no key and limits nothing."""

    tenants: dict[str, TenantLimits] = Field(default_factory=dict)
    allow_unknown_keys: bool = False
    """Serve requests whose key belongs to no tenant (unlimited) instead of a 401."""
    completion_tokens_estimate: Annotated[int, Field(ge=0, le=_MOST_PER_MINUTE)] = 256
    """Completion tokens charged up front to a request that sets no max_tokens. Bounded as the
    limits are: the charge is counted in the same float buckets."""

    @model_validator(mode="after")
    def _one_tenant_per_key(self) -> LimitsSettings:
        owner: dict[str, str] = {}
        for name, tenant in self.tenants.items():
            for i, digest in enumerate(tenant.api_key_sha256):
                if digest in owner:
                    why = f"tenants {owner[digest]!r} and {name!r} share a key hash"
                    raise error_at(("tenants", name, "api_key_sha256", i), why, digest)
                owner[digest] = name
        return self
