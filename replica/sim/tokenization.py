"""vLLM's tokenizer endpoints on the simulated replica: ``/tokenize``, ``/detokenize`` and the
render endpoints (``/v1/chat/completions/render``, ``/v1/completions/render``).

Routers that match prefixes on tokens (vllm-router's cache_aware) render every request on the
workers first; these endpoints give them the very tokens the sim would prefill for the same
body, because they run the same template, tokenizer and validation as generation
(``protocol.parse_body``). Shapes follow vLLM (``vllm/entrypoints/serve/tokenize/protocol.py``
and ``scale_out/render``): tokenize answers ``{"count", "max_model_len", "tokens",
"token_strs"}``, detokenize ``{"prompt"}``, chat render one ``GenerateRequest`` object
(``token_ids``, ``sampling_params``, ...) and completions render a list of them.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from aiohttp import web

from replica.openai_api import REQUEST_ID, ApiError
from replica.sim.config import SimConfig
from replica.sim.errors import VllmError
from replica.sim.protocol import Body, Kind, flag, load_body, parse_body, render_chat_body
from replica.sim.tokenizer import VOCAB, token_strs, tokenize

_RECENT_TEXTS = 256
_MAX_KNOWN_TOKENS = 1 << 20


class Vocabulary:
    """What the sim's token ids stand for, as far as this replica has seen them.

    A sim token id is a hash of a few characters, so it cannot be inverted; instead the replica
    remembers the last texts it tokenized (one append per request, nothing on the hot path) and
    learns their ids only when ``/detokenize`` asks. Output tokens are indices into ``VOCAB``.
    """

    def __init__(self, chars_per_token: int) -> None:
        self.chars_per_token = chars_per_token
        self._recent: deque[str] = deque(maxlen=_RECENT_TEXTS)
        self._known: dict[int, str] = {}

    def remember(self, text: str | None) -> None:
        if text:
            self._recent.append(text)

    def _learn(self) -> None:
        while self._recent:
            text = self._recent.popleft()
            if len(self._known) > _MAX_KNOWN_TOKENS:
                # Bounded memory: start over rather than track recency per token.
                self._known.clear()
            chunks = token_strs(text, self.chars_per_token)
            self._known.update(zip(tokenize(text, self.chars_per_token), chunks, strict=True))

    def detokenize(self, tokens: Iterable[int]) -> str:
        """The text of ``tokens``. An id this replica never produced reads as nothing, as an id
        outside the vocabulary does in vLLM (its tokenizer skips it): the sim's vocabulary is
        whatever it has seen, so any other id is outside it."""
        self._learn()
        pieces: list[str] = []
        for token in tokens:
            text = self._known.get(token)
            if text is None:
                text = VOCAB[token] + " " if 0 <= token < len(VOCAB) else ""
            pieces.append(text)
        return "".join(pieces)


def _json(body: Any, headers: Mapping[str, str]) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)


def _echo(request: web.Request) -> dict[str, str]:
    given = request.headers.get(REQUEST_ID)
    return {REQUEST_ID: given} if given else {}


class TokenizationHandlers:
    def __init__(self, config: SimConfig, vocabulary: Vocabulary) -> None:
        self.config = config
        self.vocabulary = vocabulary

    def _tokenize_text(self, body: Body) -> str:
        if "messages" in body:
            if body.get("chat_template") is not None:
                # vLLM refuses a per-request template unless started trusting them.
                raise VllmError(
                    400,
                    "Chat template is passed with request, but --trust-request-chat-template "
                    "is not set. Refused request with untrusted chat template.",
                    param="chat_template",
                )
            return render_chat_body(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise VllmError(400, "'prompt' must be a string", param="prompt")
        return prompt

    async def tokenize(self, request: web.Request) -> web.Response:
        headers = _echo(request)
        try:
            body = load_body(await request.read(), self.config)
            text = self._tokenize_text(body)
            with_strs = flag(body, "return_token_strs", False)
            flag(body, "add_special_tokens", True)  # the sim has no special tokens to add
        except ApiError as exc:
            return exc.response(headers)
        tokens = tokenize(text, self.config.chars_per_token)
        self.vocabulary.remember(text)
        strs = token_strs(text, self.config.chars_per_token) if with_strs else None
        return _json(
            {
                "count": len(tokens),
                "max_model_len": self.config.max_model_len,
                "tokens": tokens,
                "token_strs": strs,
            },
            headers,
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        headers = _echo(request)
        try:
            body = load_body(await request.read(), self.config)
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**63 for t in tokens
            ):
                raise VllmError(400, "'tokens' must be a list of token ids", param="tokens")
            prompt = self.vocabulary.detokenize(tokens)
        except ApiError as exc:
            return exc.response(headers)
        return _json({"prompt": prompt}, headers)

    def _generate_requests(
        self, request: web.Request, body: Body, kind: Kind, prefix: str
    ) -> list[dict[str, Any]]:
        """One GenerateRequest per prompt (a completions batch has several)."""
        parsed = parse_body(body, kind, self.config)
        given = request.headers.get(REQUEST_ID)
        stream_options = body.get("stream_options") if parsed.stream else None
        rendered = []
        for tokens, text in parsed.prompts:
            self.vocabulary.remember(text)
            rendered.append(
                self._generate_request(
                    body, parsed.n, parsed.max_tokens_for(tokens, self.config.max_model_len),
                    parsed.stream, stream_options, tokens,
                    f"{prefix}{given or uuid.uuid4().hex}",
                )
            )  # fmt: skip
        return rendered

    @staticmethod
    def _generate_request(
        body: Body,
        n: int,
        max_tokens: int,
        stream: bool,
        stream_options: Any,
        tokens: list[int],
        request_id: str,
    ) -> dict[str, Any]:
        return {
            "request_id": request_id,
            "token_ids": tokens,
            "token_offsets": None,
            "features": None,
            "content_parts": None,
            "sampling_params": {"n": n, "max_tokens": max_tokens},
            "model": body.get("model"),
            "stream": stream,
            "stream_options": stream_options,
            "cache_salt": body.get("cache_salt"),
            "priority": body.get("priority", 0),
            "kv_transfer_params": None,
        }

    async def render_chat(self, request: web.Request) -> web.Response:
        headers = _echo(request)
        try:
            body = load_body(await request.read(), self.config)
            (rendered,) = self._generate_requests(request, body, "chat", "chatcmpl-")
        except ApiError as exc:
            return exc.response(headers)
        return _json(rendered, headers)

    async def render_completion(self, request: web.Request) -> web.Response:
        headers = _echo(request)
        try:
            body = load_body(await request.read(), self.config)
            rendered = self._generate_requests(request, body, "completion", "cmpl-")
        except ApiError as exc:
            return exc.response(headers)
        # One GenerateRequest per prompt of the batch, as vLLM's render answers.
        return _json(rendered, headers)


def add_routes(app: web.Application, config: SimConfig, vocabulary: Vocabulary) -> None:
    handlers = TokenizationHandlers(config, vocabulary)
    app.router.add_post("/tokenize", handlers.tokenize)
    app.router.add_post("/detokenize", handlers.detokenize)
    app.router.add_post("/v1/chat/completions/render", handlers.render_chat)
    app.router.add_post("/v1/completions/render", handlers.render_completion)
