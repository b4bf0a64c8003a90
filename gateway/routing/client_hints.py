"""What a client says about routing besides its prompt: the session its request belongs to
(router_policies/sessions.py), its own time-to-first-token objective, its priority and the tier
it forces."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import xxhash

from gateway import headers
from gateway.http.errors import bad_request, echoed
from router_policies.fingerprint import RequestFeatures
from router_policies.session_settings import SessionSettings
from router_policies.tier_settings import TierSettings
from router_policies.tiers import Tier

_MAX_KEY = 256
"""Longer session keys are kept as their digest: the memory per session stays bounded."""
_MAX_OBJECTIVE_MS = 3_600_000.0
_PRIORITIES = range(-1000, 1001)
_TIERS = {tier.value: tier for tier in Tier}
_PLAIN_INTEGER = re.compile(r"\s*[+-]?[0-9]{1,6}\s*", re.ASCII)
"""What a header's integer is written as: Python's int() would also read other scripts' digits
and underscores, which the connections the front serves and aiohttp's decode differently."""
_PLAIN_NUMBER = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*", re.ASCII)


def session_key(body: Mapping[str, Any], sent: Mapping[str, str], settings: SessionSettings) -> str:
    """The session the request names: the header, else the first body field set; "" if none."""
    key = sent.get(settings.header, "") if settings.header else ""
    for field in settings.body_fields:
        if key:
            break
        value = body.get(field)
        key = value if isinstance(value, str) else ""
    if len(key) > _MAX_KEY or not key.isascii():
        # A header's bytes that are not UTF-8 arrive as surrogates: the digest is of the bytes
        # sent, and plain text wherever the key goes (logs, Redis).
        key = xxhash.xxh3_128_hexdigest(key.encode(errors="surrogateescape"))
    return key


def ttft_objective_s(sent: Mapping[str, str]) -> float | None:
    """The request's own TTFT objective; a malformed one is the client's error (400)."""
    name = headers.TTFT_OBJECTIVE if headers.TTFT_OBJECTIVE in sent else headers.TTFT_OBJECTIVE_LLMD
    text = sent.get(name)
    if text is None:
        return None
    ms = float(text) if _PLAIN_NUMBER.fullmatch(text) else math.nan
    if not 0 < ms <= _MAX_OBJECTIVE_MS:  # NaN fails too
        raise bad_request(
            f"Header {name} must be a number of milliseconds above 0 and at most "
            f"{_MAX_OBJECTIVE_MS:.0f}, got {echoed(text)!r}.",
            param=name,
        )
    return ms / 1000.0


def priority(sent: Mapping[str, str]) -> int:
    """The request's priority class (0 when absent); a malformed one is a 400."""
    text = sent.get(headers.PRIORITY)
    if text is None:
        return 0
    value = int(text) if _PLAIN_INTEGER.fullmatch(text) else _PRIORITIES.stop
    if value not in _PRIORITIES:
        raise bad_request(
            f"Header {headers.PRIORITY} must be an integer from {_PRIORITIES.start} to "
            f"{_PRIORITIES.stop - 1}, got {echoed(text)!r}.",
            param=headers.PRIORITY,
        )
    return value


def forced_tier(text: str | None, settings: TierSettings) -> Tier | None:
    """The tier the x-gateway-tier header forces, in any case, where the tier model's policy
    lets clients force one (`allow_header_override`; elsewhere the header is not read); any
    other value is the client's error (400), not a header silently ignored."""
    if text is None or not settings.allow_header_override:
        return None
    tier = _TIERS.get(text.lower())
    if tier is None:
        raise bad_request(
            f"Header {headers.TIER} must be one of {', '.join(_TIERS)}, got {echoed(text)!r}.",
            param=headers.TIER,
        )
    return tier


def with_client_hints(
    features: RequestFeatures,
    body: Mapping[str, Any],
    sent: Mapping[str, str],
    settings: SessionSettings,
) -> RequestFeatures:
    session = session_key(body, sent, settings) if settings.max_sessions else ""
    objective = ttft_objective_s(sent)
    rank = priority(sent)
    if not session and objective is None and not rank:
        return features
    return replace(features, session=session, ttft_objective_s=objective, priority=rank)
