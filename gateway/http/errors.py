"""OpenAI-style errors for everything the gateway rejects itself."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from gateway.fleet.pool_queue import PoolSaturated
from gateway.headers import RETRY_AFTER, RETRY_AFTER_MS
from replica.openai_api import ApiError, error_body

__all__ = ["ApiError", "error_body"]


class WithHeaders(ApiError):
    """``error`` answered with ``extra`` headers besides its own (a 405's Allow, a limited
    tenant's x-ratelimit-*)."""

    def __init__(self, error: ApiError, extra: Mapping[str, str]) -> None:
        super().__init__(
            error.status, error.message, type_=error.type, code=error.code, param=error.param
        )
        self._error = error
        self._extra = extra

    def answer_headers(self, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        return self._error.answer_headers({**self._extra, **(headers or {})})


def aiohttp_error(exc: web.HTTPException) -> ApiError:
    """An error aiohttp raised itself (an unknown path, a method the path does not take), in
    the OpenAI shape; a 405 keeps its Allow, as it must name the methods the path takes (RFC
    9110 15.5.6)."""
    error = ApiError(exc.status, exc.reason, code=exc.reason.lower().replace(" ", "_"))
    allow = exc.headers.get("Allow")
    return error if allow is None else WithHeaders(error, {"Allow": allow})


def expectation_failed() -> ApiError:
    return ApiError(417, "Only 'Expect: 100-continue' is supported.", code="expectation_failed")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


ECHO_CHARS = 64
"""How much of a client's value an error message repeats: enough to recognise it (a model's
name, a response's id), never a megabyte body field sent back whole."""


def echoed(value: str) -> str:
    """``value`` cut to ECHO_CHARS, marked as cut where it was, for an error message."""
    return value if len(value) <= ECHO_CHARS else f"{value[:ECHO_CHARS]}... ({len(value)} chars)"


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404, f"The model {echoed(model)!r} does not exist.", code="model_not_found", param="model"
    )


def internal_error() -> ApiError:
    """What a bug in the gateway answers: never its stack trace."""
    return ApiError(500, "Internal gateway error.", type_="server_error")


def no_healthy_replica(pool: str) -> ApiError:
    return ApiError(
        503,
        f"No healthy replica in pool {pool!r}.",
        type_="service_unavailable_error",
        code="no_healthy_replica",
    )


BUSY_RETRY_AFTER_S = 1
"""What a request refused by a busy pool (shed, or queued past its timeout) is told to wait
(Retry-After): about one request's service time, so the SDKs' own retries come back soon
rather than after their exponential back-off or at once."""


class RetryLater(ApiError):
    """An error whose answer says when to try again (Retry-After, and OpenAI's retry-after-ms
    that the SDKs read first)."""

    def __init__(self, status: int, message: str, retry_after_s: int, **fields: str) -> None:
        super().__init__(status, message, **fields)
        self.retry_after_s = retry_after_s

    def answer_headers(self, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        wait = self.retry_after_s
        later = {RETRY_AFTER: str(wait), RETRY_AFTER_MS: str(1000 * wait)}
        return super().answer_headers({**later, **(headers or {})})


def pool_saturated(saturated: PoolSaturated, waited_s: float) -> ApiError:
    pool = saturated.pool
    if saturated.removed is not None:
        # Retryable: the retry is routed under the new policy, which serves the model from
        # another pool or tier, or says model_not_found: either is an answer a client can use.
        return RetryLater(
            503,
            f"Pool {pool!r} of model {saturated.removed!r} was removed by a policy reload "
            "while the request waited for a replica; retry to route it under the new policy.",
            BUSY_RETRY_AFTER_S,
            type_="service_unavailable_error",
            code="pool_removed",
        )
    if saturated.shed:
        return RetryLater(
            429,
            f"Every replica of pool {pool!r} is busy, and the request is sheddable (priority "
            "below 0).",
            BUSY_RETRY_AFTER_S,
            type_="requests",
            code="pool_saturated",
        )
    return RetryLater(
        503,
        f"Every replica of pool {pool!r} stayed busy for {waited_s:g} s.",
        BUSY_RETRY_AFTER_S,
        type_="service_unavailable_error",
        code="pool_saturated",
    )


def replica_unreachable(replica: str, exc: BaseException) -> ApiError:
    """A stored response's lookup that could not reach the replica holding it."""
    return ApiError(
        502, f"Replica {replica} could not be reached: {type(exc).__name__}.",
        type_="server_error", code="upstream_unavailable",
    )  # fmt: skip


def answer_timed_out(replica: str, waited_s: float) -> ApiError:
    """A non-streaming answer the replica had not sent within GATEWAY_ANSWER_TIMEOUT_S."""
    return ApiError(
        504, f"Replica {replica} had not answered after {waited_s:g} s; the request was "
        "stopped. Stream it (stream: true) to receive its tokens as they come.",
        type_="server_error", code="response_timeout",
    )  # fmt: skip


def stored_response_unavailable(message: str, param: str) -> ApiError:
    """A stored response that only one replica holds, which cannot take the request now."""
    return ApiError(
        503, message, type_="service_unavailable_error", param=param,
        code="previous_response_unavailable",
    )  # fmt: skip


def upstream_error(replica: str, exc: BaseException) -> bytes:
    """Body of an attempt that failed before the replica's first byte."""
    if isinstance(exc, TimeoutError):
        what = "timed out before its first byte"
    else:
        what = f"could not be reached: {type(exc).__name__}"
    return error_body(f"Replica {replica} {what}.", "server_error", "upstream_unavailable")


def answer_broke(replica: str, exc: BaseException) -> bytes:
    """Body of an attempt whose non-streaming answer broke or stalled before it was whole
    (none of it had gone to the client)."""
    if isinstance(exc, TimeoutError):
        what = "stopped sending its answer partway"
    else:
        what = f"failed while answering: {type(exc).__name__}"
    return error_body(f"Replica {replica} {what}.", "server_error", "upstream_error")


def answer_unrelayable(replica: str) -> bytes:
    """Body of a failed attempt whose own error answer could not be kept: too long, broken,
    or not in within answers.FAILURE_WAIT_S."""
    return error_body(
        f"Replica {replica} failed with an error answer that could not be relayed.",
        "server_error", "upstream_error",
    )  # fmt: skip


def not_openai(replica: str, content_type: str) -> bytes:
    """Body of an attempt whose replica answered something vLLM never sends."""
    return error_body(
        f"Replica {replica} answered {content_type}, not an OpenAI answer.", "server_error",
        "upstream_error",
    )  # fmt: skip


def sse_error(exc: BaseException) -> bytes:
    """The end of a stream whose replica failed after the first byte."""
    # The stream already has a 200 status: the failure can only be reported in-band. The
    # OpenAI SDKs raise on an event carrying an "error" object.
    body = error_body(
        f"The replica failed mid-stream: {type(exc).__name__}.", "server_error", "upstream_error"
    )
    return b"data: " + body + b"\n\ndata: [DONE]\n\n"


def shutting_down() -> ApiError:
    return ApiError(
        503,
        "The gateway is shutting down; retry the request.",
        type_="service_unavailable_error",
        code="shutting_down",
    )


def shutdown_event() -> bytes:
    """The end of a stream still open at the drain deadline."""
    return b"data: " + shutting_down().body() + b"\n\ndata: [DONE]\n\n"


def too_many_connections(limit: int) -> ApiError:
    return ApiError(
        503,
        f"The gateway has {limit} client connections open, its limit; retry shortly.",
        type_="service_unavailable_error",
        code="too_many_connections",
    )
