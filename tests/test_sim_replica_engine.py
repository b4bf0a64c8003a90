"""The simulated replica's engine and its timing: continuous batching up to max_num_seqs, a
cached prefix that shortens time to first token, aborts that free blocks at once, draining
before close, a zero-delay engine that still yields and then idles, and deterministic output."""

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from replica.sim.config import SimConfig
from replica.sim.engine import Engine, FinishedRequest, SimRequest
from tests.sim import ZERO_DELAY, toks


async def drain(request: SimRequest) -> list[int]:
    return [token async for token, _ in request.stream()]


@pytest.fixture
async def make_engine() -> AsyncIterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(**overrides: object) -> Engine:
        engine = Engine(SimConfig.model_validate(overrides))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.close()


async def test_continuous_batching_admits_up_to_max_num_seqs(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(max_num_seqs=2, decode_step_s=0.002, prefill_s_per_token=0.0)
    long = engine.submit("long", toks(0, 40), max_tokens=30)
    short = engine.submit("short", toks(100, 40), max_tokens=2)
    queued = engine.submit("queued", toks(200, 40), max_tokens=2)
    assert (engine.num_running, engine.num_waiting) == (0, 3)

    most_running = 0
    finish_order: list[str] = []

    async def watch(request: SimRequest) -> None:
        await drain(request)
        finish_order.append(request.request_id)

    watchers = asyncio.gather(*(watch(r) for r in (long, short, queued)))
    while not watchers.done():
        most_running = max(most_running, engine.num_running)
        if engine.num_running == 2:
            assert engine.num_waiting <= 1
        await asyncio.sleep(0.0005)
    await watchers

    assert most_running == 2
    # The queued request joined the batch when "short" left, while "long" still ran.
    assert finish_order == ["short", "queued", "long"]
    assert [r.num_output_tokens for r in (long, short, queued)] == [30, 2, 2]
    assert engine.kv_usage() == 0.0


async def test_a_cached_prefix_shortens_time_to_first_token(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(
        prefill_s_per_token=1e-4, decode_step_s=0.0, decode_s_per_seq=0.0,
        max_num_batched_tokens=256,
    )  # fmt: skip
    records: list[FinishedRequest] = []
    engine.add_finish_listener(records.append)
    prompt = toks(0, 1000)

    cold = engine.submit("cold", prompt, max_tokens=1)
    await drain(cold)
    warm = engine.submit("warm", [*prompt, 7], max_tokens=1)
    await drain(warm)

    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == 1000 // 16 * 16
    cold_ttft, warm_ttft = records[0].ttft_s, records[1].ttft_s
    assert cold_ttft >= 1000 * 1e-4 * 0.9
    assert warm_ttft < cold_ttft / 4
    assert engine.stats.prefix_cache_queries == 2001
    assert engine.stats.prefix_cache_hits == warm.num_cached_tokens


async def test_a_request_scheduled_after_another_hits_the_blocks_that_one_is_computing(
    make_engine: Callable[..., Engine],
) -> None:
    """As vLLM's scheduler: the queue's head joins a step only while its token budget lasts,
    and a scheduled chunk's blocks are cached at once. Of two requests queued together with
    a shared prefix, the second, admitted in the next step, prefills only its own part."""
    engine = make_engine(
        prefill_s_per_token=1e-5, decode_step_s=0.0, decode_s_per_seq=0.0,
        max_num_batched_tokens=256,
    )  # fmt: skip
    shared = toks(0, 256)
    first = engine.submit("first", [*shared, *toks(500, 16)], max_tokens=1)
    second = engine.submit("second", [*shared, *toks(600, 16)], max_tokens=1)
    await asyncio.gather(drain(first), drain(second))
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 256)
    assert engine.stats.prefix_cache_hits == 256


async def test_tokens_loaded_from_the_cpu_tier_are_external_hits_as_vllm_counts_them(
    make_engine: Callable[..., Engine],
) -> None:
    """vLLM counts a KV connector's loads under vllm:external_prefix_cache_hits, not among the
    GPU cache's hits; the usage's cached tokens count both."""
    engine = make_engine(
        num_blocks=4, block_size=4, kv_offload_blocks=8, max_num_seqs=1,
        prefill_s_per_token=0.0, decode_step_s=0.0, decode_s_per_seq=0.0,
    )  # fmt: skip
    a = toks(0, 8)
    for prompt in (a, toks(100, 15), [*a, 1]):  # the second evicts A from the GPU cache
        await drain(engine.submit(str(prompt[0]), prompt, max_tokens=1))
    stats = engine.stats
    assert (stats.prefix_cache_hits, stats.external_hits) == (0, 8)
    assert stats.external_queries == 8 + 15 + 9


async def test_abort_frees_blocks_at_once(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_num_seqs=1, decode_step_s=0.005)
    running = engine.submit("running", toks(0, 64), max_tokens=1000)
    waiting = engine.submit("waiting", toks(100, 64), max_tokens=10)
    stream = running.stream()
    await anext(stream)
    assert engine.kv_usage() > 0 and engine.num_waiting == 1

    engine.abort(waiting)
    assert engine.num_waiting == 0
    engine.abort(running)
    assert engine.num_running == 0 and engine.kv_usage() == 0.0
    assert engine.stats.aborted == 2
    assert running.finish_reason == "abort"
    assert [t async for t, _ in stream] == [], "the stream ends"


async def test_drain_waits_for_in_flight_requests_then_close_aborts(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(decode_step_s=0.002)
    assert await engine.drain(0.01), "nothing to wait for"
    short = engine.submit("short", toks(0, 20), max_tokens=3)
    assert await engine.drain(1.0)
    assert short.finish_reason == "length"

    long = engine.submit("long", toks(0, 20), max_tokens=10_000)
    assert not await engine.drain(0.02)
    await engine.close()
    assert long.finish_reason == "abort" and engine.kv_usage() == 0.0


async def test_zero_delay_engine_yields_and_then_idles(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(**ZERO_DELAY)
    requests = [engine.submit(f"r{i}", toks(i * 100, 50), max_tokens=8) for i in range(40)]
    outputs = await asyncio.gather(*(drain(r) for r in requests))
    assert all(len(tokens) == 8 for tokens in outputs)

    steps = engine.stats.steps
    await asyncio.sleep(0.05)
    assert engine.stats.steps == steps, "an idle engine does not spin"


async def test_output_is_deterministic(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(**ZERO_DELAY)
    first = await drain(engine.submit("a", toks(0, 30), max_tokens=12))
    again = await drain(engine.submit("b", toks(0, 30), max_tokens=12))
    other = await drain(engine.submit("c", toks(1, 30), max_tokens=12))
    assert first == again
    assert first != other
