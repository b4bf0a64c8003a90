"""OpenAI-style errors for everything the gateway rejects itself."""

from __future__ import annotations

import orjson
from aiohttp import web


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(
            status=self.status,
            body=self.body(),
            headers={**(headers or {}), "Content-Type": "application/json"},
        )


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    error = {"message": message, "type": type_, "param": param, "code": code}
    return orjson.dumps({"error": error})


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404, f"The model {model!r} does not exist.", code="model_not_found", param="model"
    )


def no_healthy_replica(pool: str) -> GatewayError:
    return GatewayError(
        503,
        f"No healthy replica in pool {pool!r}.",
        type_="service_unavailable_error",
        code="no_healthy_replica",
    )


def pool_saturated(pool: str, waited_s: float) -> GatewayError:
    return GatewayError(
        503,
        f"Every replica of pool {pool!r} stayed busy for {waited_s:g} s.",
        type_="service_unavailable_error",
        code="pool_saturated",
    )
