"""vLLM's pooling endpoints on the simulated replica: ``/v1/embeddings``, ``/v1/score`` and
``/v1/rerank``, in vLLM's response shapes (``vllm/entrypoints/pooling/*/protocol.py``).

Each input is prefilled by the engine (one token generated and dropped), so a pooling request
costs what its prompt costs and shows in the replica's load and metrics, as a real pooling
model's would. Vectors are a deterministic function of the tokens: the same text embeds the
same, and a text scores highest against itself.
"""

from __future__ import annotations

import base64
import math
import time
import uuid
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import xxhash
from aiohttp import web

from replica.openai_api import REQUEST_ID, ApiError
from replica.sim.choices import merged
from replica.sim.config import SimConfig
from replica.sim.engine import Engine, EngineFailed, RequestRejected, SimRequest
from replica.sim.errors import VllmError
from replica.sim.protocol import cache_salt, load_body, render_chat_body
from replica.sim.tokenizer import adapter_salt, prompt_hash, tokenize

Tokens = list[int]
Salt = tuple[int, str | None]
"""What keeps a request's KV blocks apart: its adapter's salt and its ``cache_salt``."""


def embedding(tokens: Sequence[int], dim: int) -> list[float]:
    """A unit vector that depends on the tokens only."""
    seed = prompt_hash(tokens)
    raw = [
        xxhash.xxh3_64_intdigest(i.to_bytes(4, "little"), seed) / 2**63 - 1.0 for i in range(dim)
    ]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity mapped to [0, 1], as a relevance score."""
    return (1.0 + sum(x * y for x, y in zip(a, b, strict=True))) / 2.0


class PoolingHandlers:
    def __init__(self, config: SimConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine

    def _tokens(self, item: Any, param: str) -> Tokens:
        if isinstance(item, str):
            return tokenize(item, self.config.chars_per_token)
        if (
            isinstance(item, list)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in item)
        ):
            return list(item)
        raise VllmError(400, f"'{param}' must hold strings or token-id lists", param=param)

    def _inputs(self, body: Mapping[str, Any]) -> list[Tokens]:
        if isinstance(body.get("messages"), list):
            return [tokenize(render_chat_body(body), self.config.chars_per_token)]
        value = body.get("input")
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            return [self._tokens(value, "input")]
        if isinstance(value, list) and value:
            return [self._tokens(v, "input") for v in value]
        if isinstance(value, str):
            return [self._tokens(value, "input")]
        raise VllmError(400, "'input' must be a string or a non-empty list", param="input")

    async def _prefill(self, request_id: str, prompts: list[Tokens], salt: Salt) -> None:
        """Runs every prompt through the engine (its prefill is the pooling model's work)."""
        requests: list[SimRequest] = []
        adapter, salted = salt
        try:
            for i, tokens in enumerate(prompts):
                requests.append(
                    self.engine.submit(
                        f"{request_id}-{i}", tokens, 1, salt=adapter, cache_salt=salted
                    )
                )
            async for _ in merged(requests):
                pass
        except RequestRejected as exc:
            raise VllmError(400, str(exc)) from exc
        except EngineFailed as exc:
            raise VllmError(500, str(exc)) from exc
        finally:
            for request in requests:
                self.engine.abort(request)

    async def _read(self, request: web.Request) -> tuple[dict[str, Any], str, Salt]:
        body = load_body(await request.read(), self.config)
        salted = cache_salt(body)
        model = str(body.get("model") or self.config.model)
        return body, model, (adapter_salt(self.config.model, model), salted)

    async def embeddings(self, request: web.Request) -> web.Response:
        headers, request_id = _ids(request)
        try:
            body, model, salt = await self._read(request)
            prompts = self._inputs(body)
            encoding = body.get("encoding_format") or "float"
            if encoding not in ("float", "base64"):
                raise VllmError(400, "'encoding_format' must be 'float' or 'base64'",
                               param="encoding_format")  # fmt: skip
            await self._prefill(request_id, prompts, salt)
        except ApiError as exc:
            return exc.response(headers)
        data = []
        for i, tokens in enumerate(prompts):
            vector: Any = embedding(tokens, self.config.embedding_dim)
            if encoding == "base64":
                vector = base64.b64encode(array("f", vector).tobytes()).decode()
            data.append({"index": i, "object": "embedding", "embedding": vector})
        tokens_in = sum(map(len, prompts))
        return _json(
            {
                "id": f"embd-{request_id}",
                "object": "list",
                "created": int(time.time()),
                "model": model,
                "data": data,
                "usage": {
                    "prompt_tokens": tokens_in,
                    "total_tokens": tokens_in,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                },
            },
            headers,
        )

    def _pairs(
        self, first: Any, second: Any, names: tuple[str, str]
    ) -> list[tuple[Tokens, Tokens]]:
        left = (
            first
            if isinstance(first, list) and first and not isinstance(first[0], int)
            else [first]
        )
        right = (
            second
            if isinstance(second, list) and second and not isinstance(second[0], int)
            else [second]
        )
        if len(left) == 1:
            left = left * len(right)
        if len(left) != len(right):
            raise VllmError(400, f"'{names[0]}' and '{names[1]}' must have the same length, or "
                           f"'{names[0]}' one item", param=names[0])  # fmt: skip
        return [
            (self._tokens(a, names[0]), self._tokens(b, names[1]))
            for a, b in zip(left, right, strict=True)
        ]

    async def _scores(
        self, request_id: str, pairs: list[tuple[Tokens, Tokens]], salt: Salt
    ) -> list[float]:
        # A cross-encoder reads each pair as one sequence: that is what it prefills.
        await self._prefill(request_id, [a + b for a, b in pairs], salt)
        dim = self.config.embedding_dim
        return [_similarity(embedding(a, dim), embedding(b, dim)) for a, b in pairs]

    async def score(self, request: web.Request) -> web.Response:
        headers, request_id = _ids(request)
        try:
            body, model, salt = await self._read(request)
            names = next(
                (
                    (a, b)
                    for a, b in (
                        ("text_1", "text_2"),
                        ("queries", "documents"),
                        ("queries", "items"),
                        ("data_1", "data_2"),
                    )
                    if a in body and b in body
                ),
                None,
            )
            if names is None:
                raise VllmError(400, "'text_1' and 'text_2' are required", param="text_1")
            pairs = self._pairs(body[names[0]], body[names[1]], names)
            scores = await self._scores(request_id, pairs, salt)
        except ApiError as exc:
            return exc.response(headers)
        tokens_in = sum(len(a) + len(b) for a, b in pairs)
        return _json(
            {
                "id": f"score-{request_id}",
                "object": "list",
                "created": int(time.time()),
                "model": model,
                "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                "usage": {
                    "prompt_tokens": tokens_in,
                    "total_tokens": tokens_in,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                },
            },
            headers,
        )

    async def rerank(self, request: web.Request) -> web.Response:
        headers, request_id = _ids(request)
        try:
            body, model, salt = await self._read(request)
            query, documents = body.get("query"), body.get("documents")
            if not isinstance(query, str):
                raise VllmError(400, "'query' must be a string", param="query")
            if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
                raise VllmError(400, "'documents' must be a list of strings", param="documents")
            top_n = body.get("top_n") or 0
            if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
                raise VllmError(400, "'top_n' must be an integer >= 0", param="top_n")
            pairs = self._pairs(query, documents, ("query", "documents")) if documents else []
            scores = await self._scores(request_id, pairs, salt) if pairs else []
        except ApiError as exc:
            return exc.response(headers)
        ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        if top_n:
            ranked = ranked[:top_n]
        tokens_in = sum(len(a) + len(b) for a, b in pairs)
        return _json(
            {
                "id": f"rerank-{request_id}",
                "model": model,
                "usage": {"prompt_tokens": tokens_in, "total_tokens": tokens_in},
                "results": [
                    {
                        "index": i,
                        "document": {"text": documents[i], "multi_modal": None},
                        "relevance_score": scores[i],
                    }
                    for i in ranked
                ],
            },
            headers,
        )


def _ids(request: web.Request) -> tuple[dict[str, str], str]:
    given = request.headers.get(REQUEST_ID)
    return ({REQUEST_ID: given} if given else {}), given or uuid.uuid4().hex


def _json(body: Any, headers: Mapping[str, str]) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)


def add_routes(app: web.Application, config: SimConfig, engine: Engine) -> None:
    handlers = PoolingHandlers(config, engine)
    app.router.add_post("/v1/embeddings", handlers.embeddings)
    app.router.add_post("/v1/score", handlers.score)
    app.router.add_post("/v1/rerank", handlers.rerank)
