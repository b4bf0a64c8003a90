"""Checks of a policy file beyond its schema: replica URLs the gateway can actually reach, and
tier model files it can actually load.

The schema (router_policies/schema.py) types `replicas` as strings; a URL with a port out of
range, a non-numeric port or a space in its host would pass it and fail only when a request
is sent there. `check-policy`, `serve` at start-up and every reload load policies through here.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from router_policies.redis_url import mask as mask_url
from router_policies.schema import InvalidPolicy, Policy, load_policy
from router_policies.tier_classifiers import load_learned
from router_policies.yaml_locations import line_of

_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+")
"""A DNS name or IPv4 address, or an IPv6 address (urlsplit has removed its brackets)."""


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a replica's base URL, or None. The URL is shown with any password
    masked: these reasons reach check-policy's output, the reload log and the admin API."""
    shown = mask_url(url)
    if "@" in url.partition("://")[2]:
        # Refused before parsing: a password holding '?' or '#' cuts the URL short, and the
        # parse error would quote a piece of it as the port.
        return f"{shown!r} must be a base URL: no query, fragment or credentials"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{shown!r} is not a valid URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"{shown!r} must start with http:// or https://"
    if not parts.hostname or not _HOST.fullmatch(parts.hostname):
        return f"{shown!r} has no valid host name"
    if port == 0:
        return f"{shown!r} has port 0"
    if parts.query or parts.fragment:
        return f"{shown!r} must be a base URL: no query, fragment or credentials"
    return None


def replica_url_problems(policy: Policy, text: str = "") -> list[str]:
    problems = []
    for name, pool in policy.pools.items():
        seen: set[str] = set()
        for i, url in enumerate(pool.replicas):
            problem = url_problem(url)
            if problem is None and url.rstrip("/") in seen:
                problem = f"{url!r} is listed twice"
            seen.add(url.rstrip("/"))
            if problem is not None:
                path = ("pools", name, "replicas", i)
                problems.append(f"{_where(text, path)}pools.{name}.replicas.{i}: {problem}")
    return problems


def tier_model_problems(policy: Policy, text: str = "") -> list[str]:
    """Tier model files that do not load. The schema checks only that the file is there; a
    file that is not a model would otherwise pass check-policy and then fail the gateway as
    it builds its fleet (at start-up, or a reload). Loaded through the classifiers' cache, so
    building the fleet afterwards does not read the file again."""
    problems = []
    for name, tier in policy.tiers.items():
        if tier.model is None:
            continue
        try:
            load_learned(tier.model)
        except (OSError, ValueError) as exc:
            where = _where(text, ("tiers", name, "model"))
            problems.append(f"{where}tiers.{name}.model: cannot load the tier model: {exc}")
    return problems


def _where(text: str, path: tuple[str | int, ...]) -> str:
    line = line_of(text, path) if text else None
    return f"line {line}: " if line is not None else ""


def load_checked_policy(path: str | Path) -> Policy:
    """As load_policy, and its replica URLs and tier model files usable; raises OSError,
    UnicodeDecodeError or InvalidPolicy."""
    policy = load_policy(path)
    text = Path(path).read_text(encoding="utf-8")
    problems = replica_url_problems(policy, text) + tier_model_problems(policy, text)
    if problems:
        raise InvalidPolicy(problems)
    return policy
