"""What vLLM's OpenAI-compatible server and the gateway both speak: the error body and the
request-id header. One spelling for the replicas (the simulated one) and the gateway alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import orjson
from aiohttp import web

REQUEST_ID: Final = "x-request-id"
"""vLLM names a request (and its response id) after this header when the caller sends one."""


def json_body(raw: bytes) -> object:
    """A request body's JSON as vLLM reads it (Python's json, through FastAPI): a UTF-8 byte
    order mark, which some tools send first, is skipped (RFC 8259 allows it). Raises
    orjson.JSONDecodeError."""
    return orjson.loads(raw.removeprefix(b"\xef\xbb\xbf"))


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    error = {"message": message, "type": type_, "param": param, "code": code}
    return orjson.dumps({"error": error})


class ApiError(Exception):
    """An error answered with OpenAI's error body and an HTTP status."""

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

    def answer_headers(self, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        """The headers its answer carries, ``headers`` among them."""
        return {**(headers or {}), "Content-Type": "application/json"}

    def response(self, headers: Mapping[str, str] | None = None) -> web.Response:
        return web.Response(
            status=self.status, body=self.body(), headers=self.answer_headers(headers)
        )
