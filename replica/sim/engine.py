"""Continuous batching over the simulated KV cache, with a step-time model.

One asyncio task plays the GPU. Each step is planned as vLLM's scheduler plans it: the
running requests share the ``max_num_batched_tokens`` budget first (a token for each decoding
one, a chunk of its uncached prompt for each prefilling one: chunked prefill), then requests
waiting in a FCFS queue are admitted while budget is left, fewer than ``max_num_seqs`` run and
the KV cache can hold prompt + max_tokens (no preemption, so an admitted request always
finishes). A scheduled chunk's full blocks are cached at once, as vLLM's are. The step then
takes as long as the timing model says.
"""

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from replica.sim.config import SimConfig
from replica.sim.kv_cache import Allocation, KVCache
from replica.sim.kv_events import EventPublisher, KvEventsConfig
from replica.sim.tokenizer import adapter_salt, output_token, prompt_hash

logger = logging.getLogger(__name__)

_NO_TOKEN = -1  # queued alone when a request ends without a token (abort, failure)
_MAX_LAG_S = 0.05
_U64 = (1 << 64) - 1


class RequestRejected(ValueError):
    """The request can never run on this replica (it would not fit the KV cache)."""


class EngineFailed(RuntimeError):
    """The engine loop died; the request will never finish."""


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine; the HTTP handler reads its tokens with ``stream()``."""

    request_id: str
    prompt_tokens: list[int]
    max_tokens: int
    arrival_s: float
    seed: int
    salt: int = 0
    """Seeds the KV block hashes (a LoRA adapter's, and the body's ``cache_salt`` too)."""
    cache_salt: str | None = None
    allocation: Allocation | None = None
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    first_token_s: float | None = None
    finish_reason: str | None = None  # "length" or "abort" once finished
    failed: bool = False
    _tokens: asyncio.Queue[tuple[int, str | None]] = field(default_factory=asyncio.Queue)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_tokens)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache; known once admitted."""
        return 0 if self.allocation is None else self.allocation.num_cached_tokens

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    async def stream(self) -> AsyncIterator[tuple[int, str | None]]:
        """(token id, finish reason) as the engine produces them; the last token has a reason.

        Ends without a reason-carrying token when the request is aborted.
        """
        while True:
            token, reason = await self._tokens.get()
            if token == _NO_TOKEN:
                if self.failed:
                    raise EngineFailed("the simulated engine stopped")
                return
            yield token, reason
            if reason is not None:
                return


@dataclass(frozen=True)
class FinishedRequest:
    """What the metrics need from a request that ran to its end."""

    request_id: str
    finish_reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    ttft_s: float
    e2e_s: float


@dataclass
class EngineStats:
    """Cumulative counters, read at scrape time; prefix-cache figures count tokens."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    """The GPU cache's; tokens loaded from the CPU tier are the external ones, as vLLM's."""
    external_queries: int = 0
    external_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    aborted: int = 0
    steps: int = 0
    finished: dict[str, int] = field(default_factory=dict)


class Engine:
    """The scheduler and step loop of one simulated replica."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.kv_cache = KVCache(
            config.num_blocks,
            config.block_size,
            config.kv_offload_blocks,
            config.kv_offload_factor,
        )
        events = KvEventsConfig.parse(config.kv_events_config)
        self._publisher = EventPublisher(events) if events is not None else None
        if self._publisher is not None:
            self.kv_cache.events = []
        self._adapters = {adapter_salt(config.model, name): name for name in config.adapters()}
        self.stats = EngineStats()
        self._waiting: deque[SimRequest] = deque()
        self._running: list[SimRequest] = []
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[FinishedRequest], None]] = []
        self._step_end = 0.0
        self._loading_s = 0.0
        """Loading admitted requests' blocks back from the CPU tier: the next step's to pay."""

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def kv_usage(self) -> float:
        return self.kv_cache.usage()

    def add_finish_listener(self, listener: Callable[[FinishedRequest], None]) -> None:
        """Call ``listener`` for every request that finishes normally (not aborted)."""
        self._listeners.append(listener)

    def submit(
        self,
        request_id: str,
        prompt_tokens: list[int],
        max_tokens: int,
        *,
        salt: int = 0,
        sample: int = 0,
        cache_salt: str | None = None,
    ) -> SimRequest:
        """Queue a request; its tokens arrive through ``SimRequest.stream()``. ``salt`` (an
        adapter's) and ``cache_salt`` keep its KV blocks apart; ``sample`` numbers the choices of
        one prompt (n > 1): each has output of its own, as sampling at a temperature gives."""
        if max_tokens < 1:
            raise RequestRejected("max_tokens must be at least 1")
        needed = self.kv_cache.blocks_needed(len(prompt_tokens) + max_tokens)
        if needed > self.kv_cache.num_blocks:
            raise RequestRejected(
                f"prompt + max_tokens need {needed} KV blocks of {self.config.block_size} "
                f"tokens; this replica has {self.kv_cache.num_blocks}"
            )
        request = SimRequest(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            arrival_s=time.monotonic(),
            seed=(prompt_hash(prompt_tokens) ^ salt ^ sample * 0x9E3779B97F4A7C15) & _U64,
            salt=salt,
            cache_salt=cache_salt,
        )
        self._waiting.append(request)
        self._idle.clear()
        self._ensure_loop()
        self._wakeup.set()
        return request

    def abort(self, request: SimRequest) -> None:
        """Drop a request (its client went away) and release its KV blocks now."""
        if request.finished:
            return
        if request.allocation is None:
            with contextlib.suppress(ValueError):
                self._waiting.remove(request)
        else:
            with contextlib.suppress(ValueError):
                self._running.remove(request)
            self.kv_cache.free(request.allocation)
        request.finish_reason = "abort"
        request._tokens.put_nowait((_NO_TOKEN, "abort"))
        self.stats.aborted += 1
        self._wakeup.set()  # freed blocks may let the head of the queue in

    def reset_prefix_cache(self, external: bool = False) -> int | None:
        dropped = self.kv_cache.reset(external)
        self._publish()
        return dropped

    def _publish(self) -> None:
        events = self.kv_cache.events
        if events and self._publisher is not None:
            self._publisher.publish(events[:])
            events.clear()

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every queued and running request to finish."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop the loop task and abort whatever is still queued or running."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for request in [*self._running, *self._waiting]:
            self.abort(request)
        if self._publisher is not None:
            await self._publisher.close()
            self._publisher = None

    def _ensure_loop(self) -> None:
        if self._task is None or self._task.done():
            # Started lazily so that an Engine can be built outside a running event loop.
            self._task = asyncio.get_running_loop().create_task(self._loop())
            self._task.add_done_callback(self._on_loop_done)

    def _on_loop_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        logger.error("simulated engine loop failed", exc_info=task.exception())
        for request in [*self._running, *self._waiting]:
            request.failed = True
            self.abort(request)

    async def _loop(self) -> None:
        self._step_end = time.monotonic()
        while True:
            prefill, decode = self._schedule()
            self._publish()
            if not self._running:
                # Idle (or, impossibly, blocked with nothing running): sleep until submit/abort.
                if not self._waiting:
                    self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                self._step_end = time.monotonic()
                continue
            await self._step(prefill, decode)
            self._publish()

    def _schedule(self) -> tuple[list[tuple[SimRequest, int]], list[SimRequest]]:
        """One step's work as vLLM's scheduler plans it: the running requests first (a token of
        the budget for each decoding one, a chunk of what is left for a prefilling one), then
        the queue's head while budget, a sequence slot and KV blocks last. A chunk's full blocks
        are findable once scheduled, as vLLM caches them at allocation: a request scheduled
        after it, in this step or the next, hits them (the forward pass writes a layer's KV
        before attention reads it)."""
        config = self.config
        budget = config.max_num_batched_tokens
        prefill: list[tuple[SimRequest, int]] = []
        decode: list[SimRequest] = []
        for request in self._running:
            if budget <= 0:
                break
            remaining = request.num_prompt_tokens - request.num_computed_tokens
            if remaining == 0:
                decode.append(request)
                budget -= 1
            else:
                budget -= self._chunk(request, budget, prefill)
        while self._waiting and len(self._running) < config.max_num_seqs and budget > 0:
            request = self._waiting[0]
            allocation = self.kv_cache.lookup_and_allocate(
                request.prompt_tokens, request.max_tokens, request.salt,
                self._adapters.get(request.salt) if request.salt else None, request.cache_salt,
            )  # fmt: skip
            if allocation is None:
                break  # FCFS: the head waits for blocks, nobody overtakes it
            self._waiting.popleft()
            request.allocation = allocation
            request.num_computed_tokens = allocation.num_cached_tokens
            self._loading_s += (
                allocation.loaded_tokens * config.prefill_s_per_token * config.kv_load_share
            )
            self._running.append(request)
            local = allocation.num_cached_tokens - allocation.loaded_tokens
            self.stats.prefix_cache_queries += request.num_prompt_tokens
            self.stats.prefix_cache_hits += local
            if self.kv_cache.offload is not None:
                self.stats.external_queries += request.num_prompt_tokens - local
                self.stats.external_hits += allocation.loaded_tokens
            self.stats.prompt_tokens += request.num_prompt_tokens
            budget -= self._chunk(request, budget, prefill)
        return prefill, decode

    def _chunk(
        self, request: SimRequest, budget: int, prefill: list[tuple[SimRequest, int]]
    ) -> int:
        """Schedule as much of ``request``'s uncached prompt as ``budget`` allows this step;
        its full blocks are cached from now on. Returns the tokens scheduled."""
        tokens = min(request.num_prompt_tokens - request.num_computed_tokens, budget)
        prefill.append((request, tokens))
        assert request.allocation is not None
        self.kv_cache.commit(request.allocation, request.num_computed_tokens + tokens)
        return tokens

    async def _step(self, prefill: list[tuple[SimRequest, int]], decode: list[SimRequest]) -> None:
        config = self.config
        duration = sum(chunk for _, chunk in prefill) * config.prefill_s_per_token
        duration += self._loading_s
        self._loading_s = 0.0
        if decode:
            duration += config.decode_step_s + config.decode_s_per_seq * len(decode)
        await self._sleep(duration)
        self.stats.steps += 1

        # Requests aborted during the step are finished already: skip them.
        now = time.monotonic()
        for request, chunk in prefill:
            if request.finished:
                continue
            request.num_computed_tokens += chunk
            if request.num_computed_tokens == request.num_prompt_tokens:
                request.first_token_s = now
                self._emit(request, now)
        for request in decode:
            if not request.finished:
                self._emit(request, now)
        if any(request.finished for request in self._running):
            self._running = [request for request in self._running if not request.finished]

    async def _sleep(self, duration: float) -> None:
        if duration <= 0:
            # Zero-delay mode must still let the HTTP side run between steps.
            await asyncio.sleep(0)
            return
        # Busy steps run back to back on a virtual clock, so event-loop lateness in one step
        # is made up in the next ones instead of slowing the simulated GPU down; the lag that
        # can be made up is bounded so that a stalled process does not answer in a burst.
        now = time.monotonic()
        if self._step_end < now - _MAX_LAG_S:
            self._step_end = now
        self._step_end += duration
        await asyncio.sleep(max(self._step_end - now, 0.0))

    def _emit(self, request: SimRequest, now: float) -> None:
        token = output_token(request.seed, request.num_output_tokens)
        request.num_output_tokens += 1
        self.stats.generation_tokens += 1
        done = request.num_output_tokens >= request.max_tokens
        request._tokens.put_nowait((token, "length" if done else None))
        if done:
            self._finish(request, "length", now)

    def _finish(self, request: SimRequest, reason: str, now: float) -> None:
        request.finish_reason = reason
        assert request.allocation is not None
        self.kv_cache.free(request.allocation)
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        first = request.first_token_s if request.first_token_s is not None else now
        record = FinishedRequest(
            request_id=request.request_id,
            finish_reason=reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            ttft_s=first - request.arrival_s,
            e2e_s=now - request.arrival_s,
        )
        for listener in self._listeners:
            listener(record)
