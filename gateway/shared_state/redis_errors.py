"""What a failed Redis call means, in the one line an outage logs.

Most failures are an outage that ends by itself (Redis restarting, a network cut). Some are a
configuration that no retry fixes: a wrong password, a certificate this process does not
trust. The gateway fails open either way (routing on local state, no rate limits), so the
line must say which, or a misconfigured Redis reads as one that is merely away.
"""

from __future__ import annotations

import ssl

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)

FAILURES = (RedisError, OSError, TimeoutError)
"""What a call to Redis raises when Redis cannot serve it."""


_WRITE_REFUSALS = ("OOM command not allowed", "READONLY You can't write")


def _refused_in_script(exc: BaseException) -> bool:
    # Inside a Lua script (the rate limits') Redis's OOM and READONLY come back as a plain
    # ResponseError, "Error running script (...): @user_script:8: -OOM command not allowed...",
    # not as the exceptions redis-py maps them to elsewhere.
    return isinstance(exc, ResponseError) and any(why in str(exc) for why in _WRITE_REFUSALS)


def _tls_refused(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    # redis-py raises its ConnectionError from the ssl module's error.
    seen: BaseException | None = exc
    for _ in range(5):  # a bound: a chain is a few links, and could in principle loop
        if seen is None or isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def describe(exc: BaseException) -> str:
    """How a log line completes "Redis ...": what is wrong, and the exception's type."""
    name = type(exc).__name__
    if isinstance(exc, (AuthenticationError, AuthenticationWrongNumberOfArgsError)):
        return f"authentication failed ({name}): fix the password in the Redis URL"
    if isinstance(exc, NoPermissionError):
        return f"refused a command to this user ({name}): fix its ACL"
    tls = _tls_refused(exc)
    if tls is not None:
        return (
            f"TLS verification failed ({tls.verify_message or name}): fix the certificate or "
            "the CA this process trusts"
        )
    if isinstance(exc, (OutOfMemoryError, ReadOnlyError)) or _refused_in_script(exc):
        return f"refuses writes ({name})"
    return f"unreachable ({name})"
