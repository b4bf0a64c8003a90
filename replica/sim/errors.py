"""vLLM 0.32's error body, which is not OpenAI's: ``type`` names the exception class
(``BadRequestError``, ``NotFoundError``) and ``code`` repeats the HTTP status as an integer
(``vllm/entrypoints/serve/exception_handling/error_response.py``). The gateway's own errors
keep OpenAI's shape (``replica.openai_api.ApiError``); the sim answers like the engine it stands
in for, so that what the gateway relays from it is what it would relay from vLLM."""

from __future__ import annotations

from typing import Any

import orjson

from replica.openai_api import ApiError

_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


class VllmError(ApiError):
    """An error answered with vLLM's error body and an HTTP status."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, type_: str | None = None
    ) -> None:
        super().__init__(status, message, type_=type_ or _TYPES.get(status, "BadRequestError"),
                         param=param)  # fmt: skip

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param,
                 "code": self.status}  # fmt: skip
        return orjson.dumps({"error": error})


def invalid(message: str, param: str, value: Any) -> VllmError:
    """vLLM's VLLMValidationError: a 400 whose message ends with the parameter and its value."""
    return VllmError(400, f"{message} (parameter={param}, value={value})", param=param)
