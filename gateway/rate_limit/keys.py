"""API keys: only their sha256 digests are kept, in the policy file and in memory."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from router_policies.limits_settings import LimitsSettings, TenantLimits


def hash_key(key: str) -> str:
    """The digest the policy file lists for ``key`` (what `llm-gateway hash-key` prints)."""
    # A header's bytes that are not UTF-8 arrive as surrogates (aiohttp's decoding, and the
    # command line's): they are hashed as the bytes they were, never an error.
    return hashlib.sha256(key.encode(errors="surrogateescape")).hexdigest()


def bearer(headers: Mapping[str, str]) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header, as the OpenAI SDKs send it."""
    value = headers.get("Authorization")
    if value is None:
        return None
    scheme, _, key = value.strip().partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


class TenantIndex:
    """Key digest -> tenant name, for one policy generation."""

    def __init__(self, limits: LimitsSettings) -> None:
        self.limits = limits
        self._by_digest = {
            digest: name for name, t in limits.tenants.items() for digest in t.api_key_sha256
        }

    def find(self, key: str) -> tuple[str, TenantLimits] | None:
        # A lookup by digest: its timing cannot help guess a key, since no client can choose
        # the bytes of a digest (no constant-time compare is needed, unlike a raw token).
        name = self._by_digest.get(hash_key(key))
        return None if name is None else (name, self.limits.tenants[name])
