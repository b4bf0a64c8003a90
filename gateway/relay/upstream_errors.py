"""How a request to a replica fails (gateway/relay/upstream.py raises them; the proxy sorts them
into retries, ejections and the errors clients read)."""

from __future__ import annotations


class UpstreamError(Exception):
    """The replica failed: it could not be reached, broke the connection or the protocol."""


class ReplicaUnreachable(UpstreamError):
    """No connection could be made (refused, unreachable): the replica is down."""


class ConnectTimeout(UpstreamError, TimeoutError):
    """No connection within the connect timeout."""


class ReadTimeout(UpstreamError, TimeoutError):
    """The replica sent nothing for the read timeout."""


class ReplicaDisconnected(UpstreamError):
    """The replica closed the connection before its answer ended."""


class StreamFailed(UpstreamError):
    """The replica failed the request in its stream's own error event (vLLM's way, once the
    stream's headers are sent)."""


class StreamRefused(Exception):
    """vLLM refused the request in its stream's error event, with a 4xx code (a schema its
    grammar backend cannot compile, a prompt past the context): the request's fault, not the
    replica's. ``body``: the event's JSON, the error a request not streamed would be answered."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"refused the request with {status}")
        self.status = status
        self.body = body


class BadAnswer(UpstreamError):
    """The replica's bytes are not HTTP/1.1."""


def failure_reason(exc: BaseException, stream: bool) -> str:
    """How an attempt failed, for the log and passive health."""
    if isinstance(exc, ConnectTimeout):
        return "connect timeout"
    if isinstance(exc, TimeoutError):
        return "first-token timeout" if stream else "response timeout"
    return repr(exc)
