"""Where a replica's base URL points, as the upstream client writes to it: host, port, TLS,
the path prefix every request path goes under, and the Host header."""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit


@functools.cache
def _tls() -> ssl.SSLContext:
    """One default context for every https replica: made once, and only if one is https."""
    return ssl.create_default_context()


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    ssl: ssl.SSLContext | None
    prefix: bytes
    host_header: bytes

    @classmethod
    def of(cls, base_url: str) -> Target:
        parts = urlsplit(base_url)
        secure = parts.scheme == "https"
        return cls(
            parts.hostname or "localhost",
            parts.port or (443 if secure else 80),
            _tls() if secure else None,
            parts.path.rstrip("/").encode(),
            parts.netloc.rsplit("@", 1)[-1].encode(),
        )
