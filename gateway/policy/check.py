"""Checks of a policy file beyond its schema: replica URLs the gateway can actually reach, and
tier model files it can actually load.

The schema (router_policies/schema.py) types `replicas` as strings; a URL with a port out of
range, a non-numeric port or a space in its host would pass it and fail only when a request
is sent there. `check-policy`, `serve` at start-up and every reload load policies through here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from router_policies.redis_url import mask as mask_url
from router_policies.schema import InvalidPolicy, Policy, read_policy
from router_policies.tier_classifiers import load_learned
from router_policies.yaml_locations import FieldProblem, Locations

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


def replica_url_problems(policy: Policy) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    for name, pool in policy.pools.items():
        seen: set[str] = set()
        for i, url in enumerate(pool.replicas):
            problem = url_problem(url)
            if problem is None and url.rstrip("/") in seen:
                problem = f"{url!r} is listed twice"
            seen.add(url.rstrip("/"))
            if problem is not None:
                problems.append((("pools", name, "replicas", i), problem))
    return problems


def tier_model_problems(policy: Policy) -> list[FieldProblem]:
    """Tier model files that do not load. The schema checks only that the file is there; a
    file that is not a model would otherwise pass check-policy and then fail the gateway as
    it builds its fleet (at start-up, or a reload). Loaded through the classifiers' cache, so
    building the fleet afterwards does not read the file again."""
    problems: list[FieldProblem] = []
    for name, tier in policy.tiers.items():
        if tier.model_file is None:
            continue
        try:
            load_learned(tier.model_file)
        except (OSError, ValueError) as exc:
            problems.append((("tiers", name, "model"), f"cannot load the tier model: {exc}"))
    return problems


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """A policy file read and valid against the schema; its tier model files not loaded yet."""

    policy: Policy
    locations: Locations
    """Where its keys are: the problems found later name their lines from this one parse."""
    url_problems: tuple[FieldProblem, ...]


def read_policy_file(path: str | Path) -> PolicyFile:
    """Reads, parses and validates the file, and checks its replica URLs. Touches nothing the
    gateway shares, so a reload may run it off the event loop; raises OSError,
    UnicodeDecodeError or InvalidPolicy."""
    policy, locations = read_policy(Path(path).read_text(encoding="utf-8"), Path(path).parent)
    return PolicyFile(policy, locations, tuple(replica_url_problems(policy)))


def checked(file: PolicyFile) -> Policy:
    """The file's policy, once its replica URLs and tier model files are usable too; raises
    InvalidPolicy. Run by the thread that builds fleets (a gateway's event loop): the models
    load through the classifiers' cache, which takes no lock."""
    problems = [*file.url_problems, *tier_model_problems(file.policy)]
    if problems:
        raise InvalidPolicy(file.locations.describe(problems))
    return file.policy


def load_checked_policy(path: str | Path) -> Policy:
    """As load_policy, and its replica URLs and tier model files usable; raises OSError,
    UnicodeDecodeError or InvalidPolicy."""
    return checked(read_policy_file(path))
