"""vLLM's ``/v1/responses`` on the simulated replica: the Responses API over the same chat
template and engine as chat completions, in vLLM's shapes (``vllm/entrypoints/openai/responses``).

Stored responses live in this replica's memory only, as in vLLM (with
``VLLM_ENABLE_RESPONSES_API_STORE=1``): a request whose ``previous_response_id`` this replica
never served gets vLLM's 404, which is what makes routing it to the right replica matter.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from replica.openai_api import REQUEST_ID, ApiError
from replica.sim.config import SimConfig
from replica.sim.engine import Engine, EngineFailed, RequestRejected, SimRequest
from replica.sim.errors import VllmError, invalid
from replica.sim.protocol import cache_salt, check_prompt_length, flag, load_body, temperature
from replica.sim.tokenizer import TemplateError, adapter_salt, detokenize, render_chat, tokenize

Message = dict[str, Any]
_STORED = 10_000
"""Responses kept for previous_response_id (vLLM keeps them all; the sim stays bounded)."""
_TEXT_PARTS = ("input_text", "output_text", "text")
_OPENAI_TYPE = "invalid_request_error"
"""vLLM's responses store names its own errors so, in its otherwise vLLM-shaped body."""


def _bad(message: str, param: str | None = None) -> VllmError:
    return VllmError(400, message, param=param)


def input_messages(input_: Any) -> list[Message]:
    """The chat messages the Responses API's `input` stands for."""
    if isinstance(input_, str):
        return [{"role": "user", "content": input_}]
    if not isinstance(input_, list):
        raise _bad("'input' must be a string or a list of items", "input")
    messages = []
    for item in input_:
        if not isinstance(item, Mapping):
            raise _bad("each input item must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            content = item.get("content")
            if isinstance(content, list):
                content = "\n".join(
                    str(p.get("text", ""))
                    for p in content
                    if isinstance(p, Mapping) and p.get("type") in _TEXT_PARTS
                )
            if not isinstance(content, str):
                raise _bad("a message item's 'content' must be a string or parts", "input")
            messages.append({"role": item["role"], "content": content})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": str(item.get("output", ""))})
        else:
            messages.append({"role": "assistant", "content": orjson.dumps(item).decode()})
    return messages


class ResponsesHandlers:
    def __init__(self, config: SimConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.stored: OrderedDict[str, tuple[list[Message], dict[str, Any]]] = OrderedDict()
        """Response id -> the conversation it ends (its input and its output), and its body."""

    async def create(self, request: web.Request) -> web.StreamResponse:
        given = request.headers.get(REQUEST_ID)
        headers = {REQUEST_ID: given} if given else {}
        sim_request: SimRequest | None = None
        try:
            body = load_body(await request.read(), self.config)
            salted = cache_salt(body)
            model = str(body.get("model") or self.config.model)
            history = self._history(body.get("previous_response_id"))
            instructions = body.get("instructions")
            if instructions is not None and not isinstance(instructions, str):
                raise _bad("'instructions' must be a string", "instructions")
            new = input_messages(body.get("input"))
            lead = [{"role": "system", "content": instructions}] if instructions else []
            try:
                text = render_chat(lead + history + new)
            except TemplateError as exc:
                raise _bad(str(exc), "input") from exc
            tokens = tokenize(text, self.config.chars_per_token)
            max_tokens = body.get("max_output_tokens")
            if max_tokens is not None and (
                isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
            ):
                raise _bad("'max_output_tokens' must be an integer >= 1", "max_output_tokens")
            temperature(body)
            check_prompt_length(tokens, text, self.config.max_model_len)
            if max_tokens is not None and max_tokens > self.config.max_model_len:
                raise invalid(
                    f"max_output_tokens={max_tokens} cannot be greater than max_model_len="
                    f"{self.config.max_model_len}. Please request fewer output tokens.",
                    "max_output_tokens", max_tokens,
                )  # fmt: skip
            room = self.config.max_model_len - len(tokens)
            # As for chat: vLLM clamps the output budget to the room the context has left.
            max_tokens = min(
                room, self.config.default_max_tokens if max_tokens is None else max_tokens
            )
            stream = flag(body, "stream", False)
            store = flag(body, "store", True)
            salt = adapter_salt(self.config.model, model)
            sim_request = self.engine.submit(
                given or uuid.uuid4().hex, tokens, max_tokens, salt=salt, cache_salt=salted
            )
        except ApiError as exc:
            return exc.response(headers)
        except RequestRejected as exc:
            return _bad(str(exc)).response(headers)
        answer = _Answer(f"resp_{uuid.uuid4().hex}", model, body)
        try:
            if stream:
                response = await self._stream(request, sim_request, answer, headers)
            else:
                response = await self._whole(sim_request, answer, headers)
        except EngineFailed as exc:
            return VllmError(500, str(exc)).response(headers)
        finally:
            self.engine.abort(sim_request)
        if store and answer.status in ("completed", "incomplete"):
            conversation = [*history, *new, {"role": "assistant", "content": answer.text}]
            self._store(answer.id, conversation, answer.body())
        return response

    def _history(self, previous: Any) -> list[Message]:
        if previous is None:
            return []
        if not isinstance(previous, str):
            raise _bad("'previous_response_id' must be a string", "previous_response_id")
        return self._stored(previous)[0]

    def _stored(self, response_id: str) -> tuple[list[Message], dict[str, Any]]:
        stored = self.stored.get(response_id)
        if stored is None:
            # vLLM's own answer, shape and all.
            raise VllmError(
                404, f"Response with id '{response_id}' not found.", param="response_id",
                type_=_OPENAI_TYPE,
            )  # fmt: skip
        self.stored.move_to_end(response_id)
        return stored

    async def retrieve(self, request: web.Request) -> web.Response:
        try:
            _, body = self._stored(request.match_info["response_id"])
        except ApiError as exc:
            return exc.response()
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def cancel(self, request: web.Request) -> web.Response:
        """The sim answers synchronously only: what vLLM says of cancelling such a response."""
        try:
            self._stored(request.match_info["response_id"])
        except ApiError as exc:
            return exc.response()
        refusal = VllmError(
            400, "Cannot cancel a synchronous response.", param="response_id", type_=_OPENAI_TYPE
        )
        return refusal.response()

    def _store(self, response_id: str, conversation: list[Message], body: dict[str, Any]) -> None:
        self.stored[response_id] = (conversation, body)
        while len(self.stored) > _STORED:
            self.stored.popitem(last=False)

    async def _whole(
        self, sim_request: SimRequest, answer: _Answer, headers: dict[str, str]
    ) -> web.Response:
        async for token, _ in sim_request.stream():
            answer.text += detokenize(token)
        if sim_request.finish_reason in (None, "abort"):
            return VllmError(503, "request aborted").response(headers)
        answer.finish(sim_request)
        return web.Response(
            body=orjson.dumps(answer.body()), content_type="application/json", headers=headers
        )

    async def _stream(
        self,
        request: web.Request,
        sim_request: SimRequest,
        answer: _Answer,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                **headers,
            }
        )
        await response.prepare(request)
        events = _Events(answer)
        try:
            # As vLLM's: created and in_progress as the request starts, before its prefill;
            # the output item and its part with the first token.
            await response.write(events.started())
            opening = events.opening()
            async for token, _ in sim_request.stream():
                piece = detokenize(token)
                answer.text += piece
                await response.write(opening + events.delta(piece))
                opening = b""
            if sim_request.finish_reason in (None, "abort"):
                response.force_close()  # a shutdown: cut, with no completed event
                return response
            answer.finish(sim_request)
            await response.write(events.closing())
            await response.write_eof()
        except ConnectionError:
            pass  # the client left; the caller aborts the request
        except EngineFailed:
            response.force_close()
        return response


class _Answer:
    """One response as it is built: its text so far, then its final state."""

    def __init__(self, response_id: str, model: str, body: Mapping[str, Any]) -> None:
        self.id = response_id
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.model = model
        self.request = body
        self.created_at = int(time.time())
        self.text = ""
        self.status = "in_progress"
        self.usage: dict[str, Any] | None = None

    def finish(self, sim_request: SimRequest) -> None:
        # vLLM: a response cut by max_output_tokens is incomplete (its message item still
        # reads completed). Without that field the sim's default length stands for the model
        # ending its answer, which vLLM reports as completed.
        cut = self.request.get("max_output_tokens") is not None
        self.status = "incomplete" if cut and sim_request.finish_reason == "length" else "completed"
        prompt, output = sim_request.num_prompt_tokens, sim_request.num_output_tokens
        self.usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": sim_request.num_cached_tokens},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output,
        }

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": None}

    @property
    def done(self) -> bool:
        return self.status in ("completed", "incomplete")

    def item(self) -> dict[str, Any]:
        done = self.done
        return {
            "id": self.item_id,
            "type": "message",
            "role": "assistant",
            "status": "completed" if done else self.status,
            "content": [self.part()] if done else [],
        }

    def body(self) -> dict[str, Any]:
        request = self.request
        # vLLM's order (ResponsesResponse's fields): what the request set, its tools among
        # them, comes before the usage.
        return {
            "id": self.id,
            "created_at": self.created_at,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if self.status == "incomplete" else None
            ),
            "instructions": request.get("instructions"),
            "metadata": request.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": [self.item()] if self.done else [],
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "temperature": request.get("temperature", 1.0),
            "tool_choice": request.get("tool_choice", "auto"),
            "tools": request.get("tools") or [],
            "top_p": request.get("top_p", 1.0),
            "background": False,
            "max_output_tokens": request.get("max_output_tokens"),
            "previous_response_id": request.get("previous_response_id"),
            "status": self.status,
            "store": request.get("store", True),
            "error": None,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": self.usage,
            "user": None,
        }


class _Events:
    """The SSE events of a streamed response, numbered in order, as vLLM sends them."""

    def __init__(self, answer: _Answer) -> None:
        self.answer = answer
        self.sequence = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.answer.item_id, "output_index": 0, "content_index": 0}

    def started(self) -> bytes:
        body = self.answer.body()
        return self._event("response.created", response=body) + self._event(
            "response.in_progress", response=body
        )

    def opening(self) -> bytes:
        answer = self.answer
        return b"".join(
            (
                self._event("response.output_item.added", output_index=0, item=answer.item()),
                self._event(
                    "response.content_part.added",
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                    **self._where(),
                ),
            )
        )

    def delta(self, piece: str) -> bytes:
        return self._event("response.output_text.delta", delta=piece, logprobs=[], **self._where())

    def closing(self) -> bytes:
        answer = self.answer
        return b"".join(
            (
                self._event(
                    "response.output_text.done", text=answer.text, logprobs=[], **self._where()
                ),
                self._event("response.content_part.done", part=answer.part(), **self._where()),
                self._event("response.output_item.done", output_index=0, item=answer.item()),
                self._event("response.completed", response=answer.body()),
            )
        )


def add_routes(app: web.Application, config: SimConfig, engine: Engine) -> None:
    handlers = ResponsesHandlers(config, engine)
    app.router.add_post("/v1/responses", handlers.create)
    app.router.add_get("/v1/responses/{response_id}", handlers.retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", handlers.cancel)
