"""Checks of a policy file beyond its schema: replica URLs the gateway can actually reach.

The schema (router_policies/schema.py) types `replicas` as strings; a URL with a port out of
range, a non-numeric port or a space in its host would pass it and fail only when a request
is sent there. Both `check-policy` and every reload load policies through here.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from router_policies.schema import InvalidPolicy, Policy, load_policy
from router_policies.yaml_locations import line_of

_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+")
"""A DNS name or IPv4 address, or an IPv6 address (urlsplit has removed its brackets)."""


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a replica's base URL, or None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{url!r} is not a valid URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"{url!r} must start with http:// or https://"
    if not parts.hostname or not _HOST.fullmatch(parts.hostname):
        return f"{url!r} has no valid host name"
    if port == 0:
        return f"{url!r} has port 0"
    if parts.query or parts.fragment or parts.username or parts.password:
        return f"{url!r} must be a base URL: no query, fragment or credentials"
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
                line = line_of(text, ("pools", name, "replicas", i)) if text else None
                where = f"line {line}: " if line is not None else ""
                problems.append(f"{where}pools.{name}.replicas.{i}: {problem}")
    return problems


def load_checked_policy(path: str | Path) -> Policy:
    """As load_policy, and its replica URLs usable; raises OSError, UnicodeDecodeError or
    InvalidPolicy."""
    policy = load_policy(path)
    text = Path(path).read_text(encoding="utf-8")
    problems = replica_url_problems(policy, text)
    if problems:
        raise InvalidPolicy(problems)
    return policy
