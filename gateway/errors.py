"""OpenAI-style errors for everything the gateway rejects itself."""

from __future__ import annotations

from replica.openai_api import ApiError, error_body

__all__ = ["ApiError", "error_body"]


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404, f"The model {model!r} does not exist.", code="model_not_found", param="model"
    )


def no_healthy_replica(pool: str) -> ApiError:
    return ApiError(
        503,
        f"No healthy replica in pool {pool!r}.",
        type_="service_unavailable_error",
        code="no_healthy_replica",
    )


def pool_saturated(pool: str, waited_s: float) -> ApiError:
    return ApiError(
        503,
        f"Every replica of pool {pool!r} stayed busy for {waited_s:g} s.",
        type_="service_unavailable_error",
        code="pool_saturated",
    )
