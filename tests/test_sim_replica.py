"""The simulated vLLM replica: prefix cache, continuous batching, and the OpenAI/vLLM surface."""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from replica.sim.config import SimConfig
from replica.sim.engine import Engine, FinishedRequest, SimRequest
from replica.sim.kv_cache import KVCache
from replica.sim.server import ENGINE_KEY, build_app

ZERO_DELAY = {"prefill_s_per_token": 0.0, "decode_step_s": 0.0, "decode_s_per_seq": 0.0}
LONG_SYSTEM_PROMPT = "You are a careful assistant for the routing gateway docs. " * 40


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# --- KV cache -------------------------------------------------------------------------------


def test_shared_prefix_hits_only_after_commit() -> None:
    cache = KVCache(num_blocks=16, block_size=4)
    prompt = toks(0, 12)

    first = cache.lookup_and_allocate(prompt, extra_tokens=4)
    assert first is not None and first.num_cached_tokens == 0
    # Still being prefilled: a concurrent request must not hit those blocks.
    concurrent = cache.lookup_and_allocate([*prompt, 99], extra_tokens=4)
    assert concurrent is not None and concurrent.num_cached_tokens == 0

    cache.commit(first)
    longer = cache.lookup_and_allocate([*prompt, 99], extra_tokens=4)
    assert longer is not None and longer.num_cached_tokens == 12
    # The same prompt again: its last token is always recomputed, so its last block misses.
    same = cache.lookup_and_allocate(prompt, extra_tokens=4)
    assert same is not None and same.num_cached_tokens == 8


def test_hits_need_the_whole_prefix_to_match() -> None:
    cache = KVCache(num_blocks=16, block_size=4)
    original = cache.lookup_and_allocate(toks(0, 12), extra_tokens=0)
    assert original is not None
    cache.commit(original)
    # Blocks 1 and 2 hold the same tokens, but after a different first block.
    changed_head = [100, 1, 2, 3, *toks(4, 8), 99]
    assert cache.cached_prefix_tokens(changed_head) == 0
    changed_middle = [*toks(0, 4), 100, 5, 6, 7, *toks(8, 4), 99]
    assert cache.cached_prefix_tokens(changed_middle) == 4


def test_partial_blocks_are_never_shared() -> None:
    cache = KVCache(num_blocks=16, block_size=4)
    allocation = cache.lookup_and_allocate(toks(0, 7), extra_tokens=0)
    assert allocation is not None
    cache.commit(allocation)
    assert cache.cached_prefix_tokens([*toks(0, 7), 99]) == 4


def _cache_and_release(cache: KVCache, tokens: list[int], extra_tokens: int = 0) -> None:
    allocation = cache.lookup_and_allocate(tokens, extra_tokens)
    assert allocation is not None
    cache.commit(allocation)
    cache.free(allocation)


def test_freed_blocks_stay_cached_and_are_evicted_least_recently_used_first() -> None:
    cache = KVCache(num_blocks=3, block_size=4)
    a, b, c = toks(0, 4), toks(100, 4), toks(200, 4)
    for prompt in (a, b, c):
        _cache_and_release(cache, prompt)
    assert cache.usage() == 0.0
    assert all(cache.cached_prefix_tokens([*p, 1]) == 4 for p in (a, b, c))

    # Reusing A makes B the least recently used; A's new second block evicts B.
    _cache_and_release(cache, [*a, 1])
    assert cache.cached_prefix_tokens([*b, 1]) == 0
    # The next allocation takes the block left empty first, then evicts C, not A.
    _cache_and_release(cache, toks(300, 4), extra_tokens=4)
    assert cache.cached_prefix_tokens([*c, 1]) == 0
    assert cache.cached_prefix_tokens([*a, 1]) == 4


def test_pinned_blocks_are_never_evicted_and_a_full_cache_refuses() -> None:
    cache = KVCache(num_blocks=4, block_size=4)
    pinned = cache.lookup_and_allocate(toks(0, 8), extra_tokens=0)
    assert pinned is not None
    cache.commit(pinned)
    _cache_and_release(cache, toks(100, 8))

    other = cache.lookup_and_allocate(toks(200, 8), extra_tokens=0)
    assert other is not None, "the released blocks are evictable"
    assert cache.cached_prefix_tokens([*toks(0, 8), 1]) == 8, "pinned blocks survived"
    assert cache.cached_prefix_tokens([*toks(100, 8), 1]) == 0
    assert cache.usage() == 1.0

    assert cache.lookup_and_allocate(toks(300, 4), extra_tokens=0) is None
    assert cache.usage() == 1.0, "a refused allocation changes nothing"
    cache.free(other)
    cache.free(other)  # idempotent
    assert cache.usage() == 0.5


def test_a_prefix_the_cache_evicted_is_loaded_back_from_the_cpu_tier() -> None:
    a, b = toks(0, 8), toks(100, 16)
    for tier, loaded in ((6, 8), (5, 0), (0, 0)):
        cache = KVCache(num_blocks=4, block_size=4, offload_blocks=tier)
        cache.events = []
        _cache_and_release(cache, a)
        _cache_and_release(cache, b)  # B's four blocks evict A's two from the GPU cache
        assert cache.cached_prefix_tokens([*a, 1]) == 0
        again = cache.lookup_and_allocate([*a, 1], extra_tokens=0)
        assert again is not None
        # Loaded back while the tier holds A's blocks; with room for five, B's four pushed
        # out A's first, and a prefix cannot start past its first block; with no tier, A is
        # computed again.
        assert (again.num_cached_tokens, again.loaded_tokens) == (loaded, loaded)
        cpu = [e for e in cache.events if e.get("medium") == "CPU"]
        if not tier:
            assert cpu == []
            continue
        stored = [e for e in cpu if e["type"] == "BlockStored"]
        assert [len(e["block_hashes"]) for e in stored] == [2, 4]
        assert all(e["token_ids"] == [] for e in stored)
        removed = [h for e in cpu if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
        assert removed == ([] if loaded else stored[0]["block_hashes"][:1])


def test_a_cpu_tier_of_larger_blocks_writes_and_loads_whole_groups() -> None:
    # vLLM's connector with a block_size of two engine blocks: a group is written once both
    # are computed, named by its last block's hash, and loaded only whole.
    a, b = toks(0, 12), toks(100, 16)  # A: three blocks, one group and a half
    cache = KVCache(num_blocks=4, block_size=4, offload_blocks=8, offload_factor=2)
    cache.events = []
    _cache_and_release(cache, a)
    _cache_and_release(cache, b)
    again = cache.lookup_and_allocate([*a, 1], extra_tokens=0)
    assert again is not None
    assert again.loaded_tokens == 8, "the first group only: A's third block has no group"
    stored = [e for e in cache.events if e.get("medium") == "CPU" and e["type"] == "BlockStored"]
    assert [e["block_size"] for e in stored] == [8, 8]
    assert [len(e["block_hashes"]) for e in stored] == [1, 2]
    gpu = [e for e in cache.events if e.get("medium") != "CPU" and e["type"] == "BlockStored"]
    assert stored[0]["block_hashes"] == gpu[0]["block_hashes"][1:2], "named by its last block"


def test_a_refused_allocation_leaves_the_cpu_tiers_order_alone() -> None:
    cache = KVCache(num_blocks=2, block_size=4, offload_blocks=4)
    cache.events = []
    a = toks(0, 8)
    _cache_and_release(cache, a)
    _cache_and_release(cache, toks(100, 8))  # the tier holds A's two blocks, then B's
    assert cache.lookup_and_allocate([*a, *toks(500, 8), 1], extra_tokens=0) is None
    _cache_and_release(cache, toks(200, 4))  # one block more: the tier evicts its oldest
    cpu = [e for e in cache.events if e.get("medium") == "CPU"]
    removed = [e["block_hashes"] for e in cpu if e["type"] == "BlockRemoved"]
    assert removed == [cpu[0]["block_hashes"][:1]], "A's first block, still the least recent"


def test_reset_drops_cached_blocks() -> None:
    cache = KVCache(num_blocks=4, block_size=4)
    _cache_and_release(cache, toks(0, 8))
    running = cache.lookup_and_allocate(toks(100, 8), extra_tokens=0)
    assert running is not None
    cache.commit(running)

    assert cache.reset() == 4
    assert cache.cached_prefix_tokens([*toks(0, 8), 1]) == 0
    assert cache.cached_prefix_tokens([*toks(100, 8), 1]) == 0
    assert cache.usage() == 0.5, "the running request keeps its blocks"
    cache.free(running)
    assert cache.lookup_and_allocate(toks(200, 16), extra_tokens=0) is not None


# --- engine ---------------------------------------------------------------------------------


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


# --- HTTP server ----------------------------------------------------------------------------

Serve = Callable[..., Awaitable[TestServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[TestServer] = []

    async def start(**overrides: object) -> TestServer:
        config = SimConfig.model_validate({**ZERO_DELAY, **overrides})
        server = TestServer(build_app(config), handler_cancellation=True)
        await server.start_server()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


def base_url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


def client_for(server: TestServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(server) + "/v1", api_key="x", max_retries=0)


async def scrape(server: TestServer) -> dict[str, float]:
    """Every sample on /metrics, keyed by name and labels."""
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url(server) + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


async def test_chat_and_completions_answer_in_openai_format(serve: Serve) -> None:
    server = await serve()
    async with client_for(server) as client:
        chat = await client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "Hello"}], max_tokens=5
        )
        completion = await client.completions.create(
            model="sim-model", prompt="Once upon a time", max_tokens=3
        )

    assert chat.id.startswith("chatcmpl-") and chat.object == "chat.completion"
    assert chat.model == "sim-model"
    choice = chat.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert choice.message.content is not None and len(choice.message.content.split()) == 5
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + 5
    assert completion.id.startswith("cmpl-") and completion.object == "text_completion"
    assert len(completion.choices[0].text.split()) == 3
    assert completion.choices[0].finish_reason == "length"


async def test_default_max_tokens_and_max_completion_tokens(serve: Serve) -> None:
    server = await serve(default_max_tokens=7)
    async with client_for(server) as client:
        default = await client.completions.create(model="sim-model", prompt="hi")
        chat = await client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hi"}],
            max_completion_tokens=4,
        )
    assert default.usage is not None and default.usage.completion_tokens == 7
    assert chat.usage is not None and chat.usage.completion_tokens == 4


async def test_streamed_text_equals_the_whole_answer(serve: Serve) -> None:
    server = await serve()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Tell me about caches."}]},
    ]
    async with client_for(server) as client:
        whole = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=12
        )
        chunks = [
            chunk
            async for chunk in await client.chat.completions.create(
                model="sim-model",
                messages=messages,
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        whole_text = await client.completions.create(
            model="sim-model", prompt="abc def", max_tokens=6
        )
        text_chunks = [
            chunk
            async for chunk in await client.completions.create(
                model="sim-model", prompt="abc def", max_tokens=6, stream=True
            )
        ]

    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert len({c.id for c in chunks}) == 1

    assert "".join(c.choices[0].text for c in text_chunks) == whole_text.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in text_chunks), "no usage chunk unless asked"


async def test_the_first_streamed_byte_waits_for_the_first_token(serve: Serve) -> None:
    server = await serve(prefill_s_per_token=0.001)  # 100 tokens: 0.1 s of prefill
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(
            base_url(server) + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "y" * 370}], "max_tokens": 2,
                  "stream": True},
        ) as response:  # fmt: skip
            first_line = await response.content.readline()
            waited = time.monotonic() - started
            rest = await response.read()
    assert waited >= 0.09, "the role chunk must not go out before the first token"
    role = orjson.loads(first_line.removeprefix(b"data: "))
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_repeated_long_prompt_reports_cached_tokens(serve: Serve) -> None:
    server = await serve()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": LONG_SYSTEM_PROMPT},
        {"role": "user", "content": "What is a prefix cache?"},
    ]
    async with client_for(server) as client:
        first = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=2
        )
        second = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=2
        )
        async with aiohttp.ClientSession() as session:
            async with session.post(base_url(server) + "/reset_prefix_cache") as response:
                assert response.status == 200
        after_reset = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=2
        )

    def cached(response: object) -> int:
        usage = getattr(response, "usage", None)
        assert usage is not None and usage.prompt_tokens_details is not None
        return int(usage.prompt_tokens_details.cached_tokens or 0)

    assert cached(first) == 0
    assert cached(second) > 0.9 * second.usage.prompt_tokens  # type: ignore[union-attr]
    assert cached(after_reset) == 0


async def test_errors_use_the_openai_error_body(serve: Serve) -> None:
    server = await serve(max_model_len=64)
    async with client_for(server) as client:
        with pytest.raises(openai.NotFoundError) as not_found:
            await client.chat.completions.create(
                model="gpt-4", messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.completions.create(model="sim-model", prompt="x" * 1000)
    assert not_found.value.code == "model_not_found"
    assert too_long.value.code == "context_length_exceeded"

    url = base_url(server)
    async with aiohttp.ClientSession() as session:
        for path, body in [
            ("/v1/chat/completions", b"{not json"),
            ("/v1/chat/completions", b'{"model": "sim-model"}'),
            ("/v1/chat/completions", b'{"messages": []}'),
            ("/v1/completions", b'{"model": "sim-model"}'),
            ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}'),
        ]:
            async with session.post(url + path, data=body) as response:
                assert response.status == 400, body
                error = orjson.loads(await response.read())["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["type"] == "invalid_request_error" and error["message"]


async def test_request_id_is_echoed(serve: Serve) -> None:
    server = await serve()
    async with aiohttp.ClientSession() as session:
        async with session.post(
            base_url(server) + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            headers={"x-request-id": "req-42"},
        ) as response:
            assert response.headers["x-request-id"] == "req-42"
            assert (await response.json())["id"] == "chatcmpl-req-42"
        async with session.post(
            base_url(server) + "/v1/completions", json={"prompt": "hi", "model": "nope"},
            headers={"x-request-id": "req-43"},
        ) as response:  # fmt: skip
            assert response.status == 404
            assert response.headers["x-request-id"] == "req-43"


async def test_health_and_models(serve: Serve) -> None:
    server = await serve(model="llama-8b", max_model_len=4096)
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url(server) + "/health") as response:
            assert response.status == 200 and await response.read() == b""
    async with client_for(server) as client:
        models = await client.models.list()
    assert [m.id for m in models.data] == ["llama-8b"]
    assert models.data[0].model_extra == {
        "root": "llama-8b", "parent": None, "max_model_len": 4096
    }  # fmt: skip


async def test_metrics_use_vllm_names(serve: Serve) -> None:
    server = await serve(block_size=32, num_blocks=256)
    async with client_for(server) as client:
        for _ in range(2):
            await client.completions.create(model="sim-model", prompt="p" * 400, max_tokens=3)
    samples = await scrape(server)

    model = "model_name=sim-model"
    assert samples[f"vllm:num_requests_running{{{model}}}"] == 0
    assert samples[f"vllm:num_requests_waiting{{{model}}}"] == 0
    assert samples[f"vllm:kv_cache_usage_perc{{{model}}}"] == 0
    assert samples[f"vllm:prefix_cache_queries_total{{{model}}}"] == 200
    assert samples[f"vllm:prefix_cache_hits_total{{{model}}}"] == 96
    assert samples[f"vllm:prompt_tokens_total{{{model}}}"] == 200
    assert samples[f"vllm:generation_tokens_total{{{model}}}"] == 6
    assert samples[f"vllm:request_success_total{{finished_reason=length,{model}}}"] == 2
    assert samples[f"sim_requests_aborted_total{{{model}}}"] == 0
    info = "block_size=32,enable_prefix_caching=True,num_gpu_blocks=256"
    assert samples[f"vllm:cache_config_info{{{info}}}"] == 1
    assert samples[f"vllm:time_to_first_token_seconds_count{{{model}}}"] == 2
    assert samples[f"vllm:e2e_request_latency_seconds_count{{{model}}}"] == 2


async def wait_until_idle(server: TestServer, timeout_s: float = 3.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await scrape(server)
        if samples["vllm:num_requests_running{model_name=sim-model}"] == 0:
            return samples
        assert time.monotonic() < deadline, "the request kept running"
        await asyncio.sleep(0.02)


async def test_client_disconnect_mid_stream_aborts_the_request(serve: Serve) -> None:
    server = await serve(decode_step_s=0.01)
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            base_url(server) + "/v1/completions",
            json={"prompt": "tell me everything", "max_tokens": 5000, "stream": True},
        )
        first = await response.content.readline()
        assert first.startswith(b"data: ")
        assert server.app[ENGINE_KEY].num_running == 1
        response.close()

    samples = await wait_until_idle(server)
    assert samples["sim_requests_aborted_total{model_name=sim-model}"] == 1
    assert samples["vllm:kv_cache_usage_perc{model_name=sim-model}"] == 0
    assert samples["vllm:generation_tokens_total{model_name=sim-model}"] < 5000


async def test_client_disconnect_before_a_whole_answer_aborts_the_request(serve: Serve) -> None:
    server = await serve(decode_step_s=0.01)
    engine = server.app[ENGINE_KEY]

    async def ask() -> None:
        async with aiohttp.ClientSession() as session:
            await session.post(
                base_url(server) + "/v1/completions",
                json={"prompt": "tell me everything", "max_tokens": 5000},
            )

    task = asyncio.create_task(ask())
    for _ in range(400):
        if engine.num_running:
            break
        await asyncio.sleep(0.005)
    assert engine.num_running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    samples = await wait_until_idle(server)
    assert samples["sim_requests_aborted_total{model_name=sim-model}"] == 1
    assert engine.kv_usage() == 0.0


async def test_apps_in_one_process_keep_separate_metrics(serve: Serve) -> None:
    one, two = await serve(), await serve()
    async with client_for(one) as client:
        await client.completions.create(model="sim-model", prompt="only here", max_tokens=2)
    assert (await scrape(one))["vllm:generation_tokens_total{model_name=sim-model}"] == 2
    assert (await scrape(two))["vllm:generation_tokens_total{model_name=sim-model}"] == 0
