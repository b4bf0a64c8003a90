"""The OpenAI wire format as vLLM speaks it: request validation and response bodies.

Kept apart from the HTTP handlers so that the bodies can be read, and checked, in one place.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from replica.openai_api import json_body
from replica.sim.config import SimConfig
from replica.sim.errors import VllmError, invalid
from replica.sim.tokenizer import TemplateError, render_chat, tokenize

Kind = Literal["chat", "completion"]
Body = dict[str, Any]


@dataclass(frozen=True)
class ParsedRequest:
    """What the engine and the response need from a validated request body."""

    kind: Kind
    prompt_tokens: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool = False
    """A usage object on every chunk (``stream_options.continuous_usage_stats``)."""
    requested_max_tokens: int = 0
    """max_tokens as asked (or defaulted), before clamping to each prompt's room."""
    prompt_text: str | None = None
    """The rendered prompt, or None when the client sent token ids."""
    batch: tuple[tuple[list[int], str | None], ...] = ()
    """Every prompt of a completions batch (tokens, text), the first being the one above."""
    n: int = 1
    """Choices per prompt."""
    model: str = ""
    """The model or LoRA adapter named (the served model when the body names none)."""
    cache_salt: str | None = None

    def max_tokens_for(self, prompt_tokens: list[int], max_model_len: int) -> int:
        """The output budget of one prompt of the batch: vLLM clamps per prompt."""
        return min(self.requested_max_tokens or self.max_tokens, max_model_len - len(prompt_tokens))

    @property
    def prompts(self) -> tuple[tuple[list[int], str | None], ...]:
        return self.batch or ((self.prompt_tokens, self.prompt_text),)


def _bad(message: str, param: str | None = None) -> VllmError:
    return VllmError(400, message, param=param)


def too_few(max_tokens: int) -> VllmError:
    """vLLM's SamplingParams check, which names max_tokens whatever field the body used."""
    return invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)


def temperature(body: Mapping[str, Any]) -> None:
    """vLLM's SamplingParams check: a negative temperature is refused."""
    value = body.get("temperature")
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        value = float(value)
        raise invalid(f"temperature must be non-negative, got {value}.", "temperature", value)


_SALT_FORBIDDEN = frozenset("@/\\\x00")


def cache_salt(body: Mapping[str, Any]) -> str | None:
    """The body's ``cache_salt``, checked as vLLM 0.32 checks it (``validate_cache_salt``, a
    before-validator of its request models: ahead of the checks of the other fields)."""
    salt = body.get("cache_salt")
    if not isinstance(salt, str) or not salt:
        if salt is None:
            return None
        message = "must be a non-empty string if provided."
    elif len(salt) > 128 or not _SALT_FORBIDDEN.isdisjoint(salt):
        message = "must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL."
    else:
        return salt
    # vLLM gives these VLLMValidationErrors no value: the message names only the parameter.
    raise _bad(f"Parameter 'cache_salt' {message} (parameter=cache_salt)", "cache_salt")


def check_prompt_length(tokens: list[int], text: str | None, max_model_len: int) -> None:
    """vLLM's prompt length check: a prompt longer than the context is refused outright."""
    if len(tokens) <= max_model_len:
        return
    # vLLM's tokenizer stops at max_model_len + 1 tokens of a text prompt, so for text it
    # can only say "at least"; token ids are counted whole.
    count = max_model_len + 1 if text is not None else len(tokens)
    qualifier = "at least " if count == max_model_len + 1 else ""
    raise invalid(
        f"This model's maximum context length is {max_model_len} tokens. However, your "
        f"prompt contains {qualifier}{count} input tokens, which exceeds this limit even "
        "without any output tokens. Please reduce the length of the input prompt.",
        "input_tokens",
        count,
    )


def flag(body: Mapping[str, Any], name: str, default: bool, within: str | None = None) -> bool:
    """A boolean field of the body (of its object ``within``, when given); null reads as the
    default."""
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        field = f"{within}.{name}" if within else name
        raise _bad(f"'{field}' must be a boolean", within or name)
    return value


def render_chat_body(body: Mapping[str, Any]) -> str:
    """The prompt text of a chat body (``messages``, ``tools`` and the generation-prompt
    options), as generation, ``/tokenize`` and render all see it."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    if not all(isinstance(message, Mapping) for message in messages):
        raise _bad("each message must be an object", "messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _bad("'tools' must be a list", "tools")
    add_generation_prompt = flag(body, "add_generation_prompt", True)
    continue_final_message = flag(body, "continue_final_message", False)
    if add_generation_prompt and continue_final_message and "add_generation_prompt" in body:
        # vLLM refuses the pair only when both are asked for explicitly.
        raise _bad(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    try:
        return render_chat(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
        )
    except TemplateError as exc:
        raise _bad(str(exc), "messages") from exc


def _prompts(
    body: Mapping[str, Any], kind: Kind, config: SimConfig
) -> list[tuple[list[int], str | None]]:
    if kind == "chat":
        text = render_chat_body(body)
        return [(tokenize(text, config.chars_per_token), text)]
    prompt = body.get("prompt")
    # A batch: a list of strings, or of token-id lists (a flat list of ints is one prompt).
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return [_one_prompt(p, config) for p in prompt]
    return [_one_prompt(prompt, config)]


def _one_prompt(prompt: Any, config: SimConfig) -> tuple[list[int], str | None]:
    if isinstance(prompt, str) and prompt:
        return tokenize(prompt, config.chars_per_token), prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return list(prompt), None
    raise _bad("'prompt' must be a non-empty string or list of token ids", "prompt")


def _max_tokens(body: Mapping[str, Any], kind: Kind, max_model_len: int) -> int | None:
    value = body.get("max_completion_tokens") if kind == "chat" else None
    param = "max_completion_tokens"
    if value is None:
        value, param = body.get("max_tokens"), "max_tokens"
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(f"'{param}' must be an integer", param)
    if value < 1:
        raise too_few(value)
    if value > max_model_len:
        raise invalid(
            f"{param}={value} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param,
            value,
        )
    return value


def load_body(raw: bytes, config: SimConfig) -> Body:
    """A JSON object body naming this replica's model (or none)."""
    try:
        body = json_body(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    # vLLM serves its one model when the field is left out.
    if model is not None and not config.serves(model):
        # vLLM lists its served model names, not its adapters, as the valid aliases.
        raise VllmError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {config.model}.",
            param="model",
        )
    return body


def parse_request(raw: bytes, kind: Kind, config: SimConfig) -> ParsedRequest:
    """Validate a completions or chat completions body the way vLLM would."""
    return parse_body(load_body(raw, config), kind, config)


def parse_body(body: Mapping[str, Any], kind: Kind, config: SimConfig) -> ParsedRequest:
    """``parse_request`` for a body already loaded by ``load_body``."""
    salt = cache_salt(body)
    n = 1 if body.get("n") is None else body["n"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
        raise _bad("'n' must be an integer from 1 to 128", "n")
    stream = flag(body, "stream", False)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise _bad("'stream_options' must be an object", "stream_options")
    if stream_options and not body.get("stream"):  # vLLM's check, on the values as sent
        raise _bad("Stream options can only be defined when `stream=True`.", "stream_options")
    # vLLM 0.32's StreamOptions has `include_usage: bool | None = False`: only true asks
    include_usage = (
        stream
        and stream_options is not None
        and flag(stream_options, "include_usage", False, within="stream_options")
    )
    # Per-chunk usage, which vLLM sends only when usage is asked for at all.
    continuous_usage = (
        include_usage
        and stream_options is not None
        and flag(stream_options, "continuous_usage_stats", False, within="stream_options")
    )

    temperature(body)
    batch = _prompts(body, kind, config)
    tokens, text = batch[0]
    for prompt, prompt_text in batch:
        check_prompt_length(prompt, prompt_text, config.max_model_len)
    requested = _max_tokens(body, kind, config.max_model_len)
    if requested is None:
        requested = config.default_max_tokens
    # vLLM clamps max_tokens to what the context has left after each prompt rather than
    # refusing the request (``get_max_tokens``).
    max_tokens = min(requested, config.max_model_len - len(tokens))
    if max_tokens < 1:  # a prompt filling the whole context leaves no room
        raise too_few(max_tokens)
    return ParsedRequest(
        kind=kind,
        prompt_tokens=tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        requested_max_tokens=requested,
        prompt_text=text,
        batch=tuple(batch) if len(batch) > 1 else (),
        n=n,
        model=str(body.get("model") or config.model),
        cache_salt=salt,
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Body:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class ResponseFormat:
    """Builds the bodies of one response; one subclass per endpoint."""

    id_prefix = ""
    object_whole = ""
    object_chunk = ""

    def __init__(
        self,
        request_id: str,
        model: str,
        created: int,
        include_usage: bool,
        continuous_usage: bool = False,
    ) -> None:
        self.id = f"{self.id_prefix}{request_id}"
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage

    def _envelope(self, object_: str, choices: list[Body]) -> Body:
        return {
            "id": self.id,
            "object": object_,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def whole(self, choices: list[tuple[str, str]], usage_: Body) -> Body:
        """The whole answer: (text, finish reason) of each choice, in index order."""
        whole = [self._whole_choice(text, reason, i) for i, (text, reason) in enumerate(choices)]
        body = self._envelope(self.object_whole, whole)
        body["usage"] = usage_
        return body

    def opening_chunks(self, index: int = 0, prompt_tokens: int = 0) -> list[Body]:
        return []

    def chunk(
        self,
        text: str,
        finish_reason: str | None,
        index: int = 0,
        counts: tuple[int, int] = (0, 0),
    ) -> Body:
        """One token's chunk; ``counts`` (prompt tokens, output tokens so far) of its choice
        fill the usage object that continuous usage stats put on every chunk."""
        return self._chunk([self._chunk_choice(text, finish_reason, index)], counts)

    def running_usage(self, prompt_tokens: int, completion_tokens: int) -> Body:
        """vLLM's per-chunk usage: one choice's counts, without prompt token details."""
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }

    def usage_chunk(self, usage_: Body) -> Body:
        body = self._envelope(self.object_chunk, [])
        body["usage"] = usage_
        return body

    def _chunk(self, choices: list[Body], counts: tuple[int, int]) -> Body:
        body = self._envelope(self.object_chunk, choices)
        # Without continuous usage stats vLLM's chunks carry no usage field at all (OpenAI's
        # carry "usage": null); the usage-only chunk at the end comes either way.
        if self.continuous_usage:
            body["usage"] = self.running_usage(*counts)
        return body

    def _whole_choice(self, text: str, finish_reason: str, index: int) -> Body:
        raise NotImplementedError

    def _chunk_choice(self, text: str, finish_reason: str | None, index: int) -> Body:
        raise NotImplementedError


class ChatFormat(ResponseFormat):
    id_prefix = "chatcmpl-"
    object_whole = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def opening_chunks(self, index: int = 0, prompt_tokens: int = 0) -> list[Body]:
        role = {"role": "assistant", "content": ""}
        choice = {"index": index, "delta": role, "logprobs": None, "finish_reason": None}
        return [self._chunk([choice], (prompt_tokens, 0))]

    def running_usage(self, prompt_tokens: int, completion_tokens: int) -> Body:
        # vLLM's chat usage carries completion_tokens_details; its completions usage does not.
        return {**super().running_usage(prompt_tokens, completion_tokens),
                "completion_tokens_details": None}  # fmt: skip

    def _whole_choice(self, text: str, finish_reason: str, index: int) -> Body:
        message = {"role": "assistant", "content": text}
        return {
            "index": index, "message": message, "logprobs": None, "finish_reason": finish_reason
        }  # fmt: skip

    def _chunk_choice(self, text: str, finish_reason: str | None, index: int) -> Body:
        delta = {"content": text}
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


class CompletionFormat(ResponseFormat):
    id_prefix = "cmpl-"
    object_whole = "text_completion"
    object_chunk = "text_completion"

    def _whole_choice(self, text: str, finish_reason: str, index: int) -> Body:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def _chunk_choice(self, text: str, finish_reason: str | None, index: int) -> Body:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


FORMATS: dict[Kind, type[ResponseFormat]] = {"chat": ChatFormat, "completion": CompletionFormat}
