"""The HTTP face of the simulated replica: vLLM's OpenAI server routes over the engine.

Run the app with ``handler_cancellation=True`` (``make_runner`` does): a client that goes
away then cancels its handler, which aborts the request in the engine and frees its KV
blocks, as vLLM does. Streams also notice a dead client on their next write.
"""

import functools
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

from replica.openai_api import REQUEST_ID, ApiError
from replica.sim import pooling, responses
from replica.sim.choices import merged
from replica.sim.config import SimConfig
from replica.sim.engine import Engine, EngineFailed, RequestRejected, SimRequest
from replica.sim.errors import VllmError
from replica.sim.metrics import SimMetrics
from replica.sim.protocol import FORMATS, Kind, ResponseFormat, parse_request, usage
from replica.sim.tokenization import Vocabulary, add_routes
from replica.sim.tokenizer import adapter_salt, detokenize

ENGINE_KEY = web.AppKey("sim_engine", Engine)
CONFIG_KEY = web.AppKey("sim_config", SimConfig)
_MAX_BODY_BYTES = 64 * 1024 * 1024
# On SIGTERM, requests still running after this long are aborted, as a real server's are
# when its pod is deleted; aiohttp's default (60 s) would make every stop slow.
_SHUTDOWN_GRACE_S = 2.0


def _json(body: Any, headers: dict[str, str], status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


class _Handlers:
    def __init__(
        self, config: SimConfig, engine: Engine, metrics: SimMetrics, vocabulary: Vocabulary
    ) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics
        self.vocabulary = vocabulary
        self.created = int(time.time())

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        given_id = request.headers.get(REQUEST_ID)
        headers = {REQUEST_ID: given_id} if given_id else {}
        # vLLM builds the response id from the caller's request id when there is one. Without
        # one, vLLM's is a random hex; the sim's leads with its port ("chatcmpl-8001-<hex>"),
        # an opaque id still, which says which replica answered through any router.
        request_id = given_id or f"{self.config.port}-{uuid.uuid4().hex}"
        sim_requests: list[SimRequest] = []
        try:
            parsed = parse_request(await request.read(), kind, self.config)
            salt = adapter_salt(self.config.model, parsed.model)
            # vLLM's choice order: every sample of the first prompt, then of the next.
            for p, (tokens, text) in enumerate(parsed.prompts):
                for sample in range(parsed.n):
                    sim_requests.append(
                        self.engine.submit(
                            f"{request_id}-{p}-{sample}", tokens,
                            parsed.max_tokens_for(tokens, self.config.max_model_len),
                            salt=salt, sample=sample, cache_salt=parsed.cache_salt,
                        )
                    )  # fmt: skip
                self.vocabulary.remember(text)
        except ApiError as exc:
            self._abort(sim_requests)
            return exc.response(headers)
        except RequestRejected as exc:
            self._abort(sim_requests)
            return VllmError(400, str(exc)).response(headers)

        fmt = FORMATS[kind](
            request_id, parsed.model, int(time.time()), parsed.include_usage,
            parsed.continuous_usage,
        )  # fmt: skip
        usage_of = functools.partial(_usage, sim_requests, parsed.n)
        try:
            if parsed.stream:
                return await self._stream(request, sim_requests, fmt, usage_of, headers)
            return await self._whole(request, sim_requests, fmt, usage_of, headers)
        except EngineFailed as exc:
            return VllmError(500, str(exc)).response(headers)
        finally:
            # No-op when it finished; otherwise the client is gone (cancelled or write failed).
            self._abort(sim_requests)

    def _abort(self, sim_requests: list[SimRequest]) -> None:
        for sim_request in sim_requests:
            self.engine.abort(sim_request)

    async def _whole(
        self,
        request: web.Request,
        sim_requests: list[SimRequest],
        fmt: ResponseFormat,
        usage_of: Callable[[], dict[str, Any]],
        headers: dict[str, str],
    ) -> web.StreamResponse:
        pieces: list[list[str]] = [[] for _ in sim_requests]
        async for index, token, _ in merged(sim_requests):
            pieces[index].append(detokenize(token))
            if request.transport is None or request.transport.is_closing():
                # Client gone; handler cancellation usually gets here first.
                return web.Response(status=499)
        choices = []
        for sim_request, texts in zip(sim_requests, pieces, strict=True):
            reason = sim_request.finish_reason
            if reason is None or reason == "abort":
                # Only the server shutting down aborts a request whose client is still there.
                return VllmError(503, "request aborted").response(headers)
            choices.append(("".join(texts), reason))
        return _json(fmt.whole(choices, usage_of()), headers)

    async def _stream(
        self,
        request: web.Request,
        sim_requests: list[SimRequest],
        fmt: ResponseFormat,
        usage_of: Callable[[], dict[str, Any]],
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
        try:
            sent = [0] * len(sim_requests)  # tokens streamed per choice, for running usage
            async for index, token, reason in merged(sim_requests):
                prompt_tokens = sim_requests[index].num_prompt_tokens
                sent[index] += 1
                body = _sse(
                    fmt.chunk(detokenize(token), reason, index, (prompt_tokens, sent[index]))
                )
                if sent[index] == 1:
                    # Like vLLM, the role chunk goes out with the first token, not before it:
                    # a client timing its first byte measures time to first token.
                    opening = fmt.opening_chunks(index, prompt_tokens)
                    body = b"".join(_sse(chunk) for chunk in opening) + body
                await response.write(body)
            if any(r.finish_reason == "abort" for r in sim_requests):
                # Only a shutdown aborts a live stream: end it without [DONE], as a cut.
                response.force_close()
                return response
            if fmt.include_usage:
                await response.write(_sse(fmt.usage_chunk(usage_of())))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            # The client went away mid-stream; the caller's finally aborts the request.
            pass
        except EngineFailed:
            # Headers are out, so no error status can follow: cut the stream instead.
            response.force_close()
        return response

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
        }
        # vLLM lists each --lora-modules adapter after the base model, its parent.
        adapters = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": path,
                "parent": self.config.model,
                "max_model_len": None,
            }
            for name, path in self.config.adapters().items()
        ]
        return _json({"object": "list", "data": [card, *adapters]}, {})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        # vLLM's answer: 200 either way, whether it did in the body.
        external = request.query.get("reset_external", "").lower() in ("1", "true", "yes", "on")
        done = self.engine.reset_prefix_cache(external) is not None
        return _json({"success": done}, {})

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4}
        )


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _usage(sim_requests: list[SimRequest], n: int) -> dict[str, Any]:
    """Prompt tokens count once per prompt (its first sample), output tokens per choice."""
    firsts = sim_requests[::n]
    return usage(
        sum(r.num_prompt_tokens for r in firsts),
        sum(r.num_output_tokens for r in sim_requests),
        sum(r.num_cached_tokens for r in firsts),
    )


def build_app(config: SimConfig) -> web.Application:
    """A simulated vLLM OpenAI server; its engine and metrics registry belong to this app."""
    # Long prompts (or token-id lists) easily pass aiohttp's 1 MiB default; vLLM has no cap.
    app = web.Application(client_max_size=_MAX_BODY_BYTES)
    engine = Engine(config)
    vocabulary = Vocabulary(config.chars_per_token)
    handlers = _Handlers(config, engine, SimMetrics(engine), vocabulary)
    app[ENGINE_KEY] = engine
    app[CONFIG_KEY] = config
    app.router.add_post("/v1/chat/completions", handlers.chat)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_post("/reset_prefix_cache", handlers.reset_prefix_cache)
    app.router.add_get("/metrics", handlers.metrics_page)
    add_routes(app, config, vocabulary)
    pooling.add_routes(app, config, engine)
    responses.add_routes(app, config, engine)

    async def finish_then_abort(app: web.Application) -> None:
        # Runs before aiohttp waits on open handlers: aborting ends their streams at once.
        await app[ENGINE_KEY].drain(_SHUTDOWN_GRACE_S)
        await app[ENGINE_KEY].close()

    app.on_shutdown.append(finish_then_abort)
    # Apps started without a runner shutdown (some test servers) still stop the engine task.
    app.on_cleanup.append(lambda app: app[ENGINE_KEY].close())
    return app


def make_runner(config: SimConfig) -> web.AppRunner:
    """An AppRunner for ``build_app`` with the settings the replica relies on."""
    return web.AppRunner(
        build_app(config),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=_SHUTDOWN_GRACE_S,
    )
