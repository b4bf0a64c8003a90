"""Redis URLs as operators write them: which ones redis-py can use, and how to show one safely.

A URL carries its password in the userinfo (``redis://user:password@host``) or in the query
(``?password=...``, ``?ssl_password=...`` for a TLS key, any name percent-encoded since
redis-py decodes names); redis-py reads all of them, so all are masked wherever a URL is shown:
logs, ``check-policy``, ``/admin/policy``, error messages.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote_plus, urlsplit

SCHEMES = ("redis", "rediss", "unix")
MASK = "***"

_QUERY_PARAMETER = re.compile(r"([?&])([^=&#]*)=([^&]*)")
"""A value runs to the next '&', past a '#': redis-py stops a password at the '#' (the URL's
fragment), but what follows was meant as part of it."""
_DB_PATH = re.compile(r"/?|/\d+")
_TIMEOUT_OPTIONS = frozenset(
    ("socket_timeout", "socket_connect_timeout", "retry_on_timeout", "retry_on_error")
)
"""What redis-py would read from the URL over the gateway's own bound on each call (a retry
on a timeout doubles the wait)."""


def mask(url: str) -> str:
    """``url`` with its password replaced by ``***``: redis://:***@host:6379/0. Works on any
    text, valid URL or not, since error messages about a bad URL show it too."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        # Up to the last '@': an unescaped '@' or '/' in a password stays on the masked side.
        userinfo, _, host = rest.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        # No colon: redis-py reads a user name, but operators put passwords there too.
        shown = f"{user}:{MASK}" if colon else MASK
        url = f"{scheme}://{shown}@{host}"
    return _QUERY_PARAMETER.sub(_masked_parameter, url)


def _masked_parameter(found: re.Match[str]) -> str:
    """A query parameter as written, its value masked where its name, decoded as redis-py
    decodes it (parse_qs), names a password of any kind."""
    separator, name, value = found.groups()
    if "password" in unquote_plus(name).lower():
        value = MASK
    return f"{separator}{name}={value}"


def problem(url: str) -> str | None:
    """Why ``url`` is not a Redis URL redis-py can connect to, or None. The URL is shown
    masked."""
    shown = mask(url)
    userinfo = url.partition("://")[2].rpartition("@")[0]
    if any(mark in userinfo for mark in "/?#"):
        # Parsed, the URL would end its host at that mark, and a parse error quote the rest.
        return f"{shown!r}: percent-encode '/', '?' and '#' in the password (%2F, %3F, %23)"
    try:
        parts = urlsplit(url)
        _ = parts.port  # parsing it is the check: a bad port raises ValueError
    except ValueError as exc:
        return f"{shown!r} is not a valid URL: {exc}"
    timeouts = sorted(_TIMEOUT_OPTIONS & {name.lower() for name in parse_qs(parts.query)})
    if timeouts:
        return (
            f"{shown!r}: {', '.join(timeouts)} in the URL would override GATEWAY_STATE_TIMEOUT_S, "
            "which bounds every Redis call a request waits for: leave it out (set that instead)"
        )
    if parts.scheme not in SCHEMES:
        return f"{shown!r} must start with redis://, rediss:// (TLS) or unix:// (a socket)"
    if parts.scheme == "unix":
        return None if parts.path else f"{shown!r} names no socket: unix:///path/to/redis.sock"
    if not parts.hostname:
        return f"{shown!r} has no host: redis://[:password@]host:port/db"
    if not _DB_PATH.fullmatch(parts.path):
        return f"{shown!r}: the path must be a database number, like /0"
    return None


def checked(url: str) -> str | None:
    """``url`` without surrounding blanks, or None when that leaves nothing (compose files and
    charts render "" to mean "no Redis"); raises ValueError with ``problem``'s reason."""
    url = url.strip()
    if not url:
        return None
    reason = problem(url)
    if reason is not None:
        raise ValueError(reason)
    return url
