"""Model tiers end to end: classification into pools, forcing a tier, overflow under saturation,
and what feeds the calibration and the conversation memory."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from bench.launcher import start_gateway
from gateway import headers
from replica.processes import ManagedProcess, free_port
from tests.conftest import (
    FAST_PROBES,
    admin_route,
    eventually,
    get_text,
    in_process_gateway,
    in_process_sims,
    metric,
    official_client,
    running_sims,
)
from tests.tiers import tiered_policy

pytestmark = pytest.mark.asyncio(loop_scope="module")

EASY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 4,
}
HARD: dict[str, Any] = {
    "messages": [
        {
            "role": "user",
            "content": "Prove step by step that the integral of $e^{-x^2}$ over the real line is "
            "$\\sqrt{\\pi}$, then compare two derivations and justify which is more rigorous.",
        }
    ],
    "max_tokens": 4,
}


ADMIN_TOKEN = "tiers-admin"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pools() -> AsyncIterator[dict[str, ManagedProcess]]:
    async with (
        running_sims(1, "small-model", decode_step_s=0.05) as [small],
        running_sims(1, "large-model", decode_step_s=0.01) as [large],
    ):
        yield {"small": small, "large": large}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(pools: dict[str, ManagedProcess]) -> AsyncIterator[ManagedProcess]:
    env = {**FAST_PROBES, "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
    gw = await start_gateway(tiered_policy(pools, allow_header_override=True), env=env)
    yield gw
    await gw.stop()


async def ask(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], **hdrs: str
) -> tuple[dict[str, str], dict[str, Any]]:
    async with session.post(
        f"{url}/v1/chat/completions", data=orjson.dumps({"model": "auto", **body}), headers=hdrs
    ) as response:
        assert response.status == 200, await response.text()
        return dict(response.headers), await response.json()


async def test_easy_and_hard_requests_reach_their_pools_with_the_reason(
    gateway: ManagedProcess,
) -> None:
    async with aiohttp.ClientSession() as session:
        easy_headers, easy_body = await ask(session, gateway.url, EASY)
        hard_headers, hard_body = await ask(session, gateway.url, HARD)
    assert (easy_headers[headers.POOL], easy_headers[headers.TIER]) == ("small", "small")
    assert (hard_headers[headers.POOL], hard_headers[headers.TIER]) == ("large", "large")
    assert float(easy_headers[headers.TIER_SCORE]) < 0.5 <= float(hard_headers[headers.TIER_SCORE])
    # The replica was asked for its own model name, not the virtual one.
    assert (easy_body["model"], hard_body["model"]) == ("small-model", "large-model")


async def test_a_responses_api_request_is_classified_by_its_input(gateway: ManagedProcess) -> None:
    client = official_client(gateway.url)
    tiers = {}
    for name, body in (("easy", EASY), ("hard", HARD)):
        raw = await client.responses.with_raw_response.create(
            model="auto", input=body["messages"][0]["content"], max_output_tokens=4
        )
        tiers[name] = (raw.headers[headers.POOL], raw.headers[headers.TIER])
        assert raw.parse().model == f"{tiers[name][0]}-model"
    assert tiers == {"easy": ("small", "small"), "hard": ("large", "large")}


async def test_a_follow_up_by_previous_response_id_goes_where_its_response_is_stored(
    gateway: ManagedProcess,
) -> None:
    client = official_client(gateway.url)
    task = HARD["messages"][0]["content"]
    first = await client.responses.with_raw_response.create(
        model="auto", input=task, max_output_tokens=4
    )
    assert first.headers[headers.POOL] == "large"
    # Read alone the follow-up is easy, but only the large pool's replica holds its history.
    follow = await client.responses.with_raw_response.create(
        model="auto", input="Thanks! Shorter?", previous_response_id=first.parse().id,
        max_output_tokens=4,
    )  # fmt: skip
    assert follow.headers[headers.POOL] == "large"
    assert follow.headers[headers.REPLICA] == first.headers[headers.REPLICA]
    body = {"model": "auto", "input": "Shorter?", "previous_response_id": first.parse().id}
    explained = await admin_route(gateway.url, ADMIN_TOKEN, body, "/v1/responses")
    assert explained["pool"] == "large" and explained["tier"]["kept_by_stored_response"]
    # The dry run gives the route the answer did: the stored response's replica decided it.
    assert explained["route"] == follow.headers[headers.ROUTE] == "pinned"


async def test_models_lists_the_virtual_model_too(gateway: ManagedProcess) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{gateway.url}/v1/models") as response,
    ):
        ids = [m["id"] for m in (await response.json())["data"]]
    assert ids == ["small-model", "large-model", "auto"]


async def test_naming_a_pools_model_skips_classification(gateway: ManagedProcess) -> None:
    body = orjson.dumps({"model": "small-model", **HARD})
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/v1/chat/completions", data=body) as response,
    ):
        assert response.status == 200
        assert response.headers[headers.POOL] == "small"
        assert headers.TIER not in response.headers


async def test_a_header_may_force_the_tier_when_the_policy_allows(gateway: ManagedProcess) -> None:
    async with aiohttp.ClientSession() as session:
        forced, _ = await ask(session, gateway.url, EASY, **{headers.TIER: "large"})
    assert (forced[headers.POOL], forced[headers.TIER]) == ("large", "large")


async def test_a_forced_tier_is_read_in_any_case_and_any_other_value_is_a_400(
    gateway: ManagedProcess,
) -> None:
    async with aiohttp.ClientSession() as session:
        forced, _ = await ask(session, gateway.url, EASY, **{headers.TIER: "LARGE"})
        assert (forced[headers.POOL], forced[headers.TIER]) == ("large", "large")
        for value in ("big", "large;q=1", ""):
            async with session.post(
                f"{gateway.url}/v1/chat/completions",
                data=orjson.dumps({"model": "auto", **EASY}),
                headers={headers.TIER: value},
            ) as response:
                assert response.status == 400, value
                error = (await response.json())["error"]
            assert error["param"] == headers.TIER and "small, large" in error["message"]
    # The dry run reads the header as the request would.
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway.url}/admin/route", data=orjson.dumps({"model": "auto", **EASY}),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}", headers.TIER: "big"},
        ) as response,
    ):  # fmt: skip
        assert response.status == 400


async def test_the_header_is_ignored_when_the_policy_does_not_allow_it(
    pools: dict[str, ManagedProcess],
) -> None:
    gw = await start_gateway(tiered_policy(pools), env=FAST_PROBES)
    try:
        async with aiohttp.ClientSession() as session:
            for value in ("large", "big"):  # not read at all: no tier forced, no 400
                got, _ = await ask(session, gw.url, EASY, **{headers.TIER: value})
                assert got[headers.POOL] == "small"
    finally:
        await gw.stop()


OPENING = "Hi! I have a few questions for you today."
HARD_TEXT = HARD["messages"][0]["content"]


def turns(*users: str) -> list[dict[str, str]]:
    """A conversation's messages: its user turns, each answered but the last."""
    messages = []
    for i, text in enumerate(users):
        if i:
            messages.append({"role": "assistant", "content": "Here you go."})
        messages.append({"role": "user", "content": text})
    return messages


async def test_only_generation_feeds_the_calibration_and_the_conversation_memory(
    pools: dict[str, ManagedProcess],
) -> None:
    # Target share 0: once calibrated, the threshold is +inf and nothing is scored large.
    calibration = {"target_large_share": 0.0, "window": 10, "min_samples": 10}
    policy = tiered_policy(pools, calibration=calibration)
    gw = await start_gateway(policy, env={**FAST_PROBES, "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN})

    async def threshold() -> float | None:
        return metric((await get_text(f"{gw.url}/metrics"))[1], "gateway_tier_threshold")

    try:
        async with aiohttp.ClientSession() as session:
            utility = [("/tokenize", {"messages": turns(OPENING, HARD_TEXT)})] * 10 + [
                ("/v1/embeddings", {"input": HARD_TEXT})
            ] * 2
            routed = set()
            for path, body in utility:
                async with session.post(
                    f"{gw.url}{path}", data=orjson.dumps({"model": "auto", **body})
                ) as response:
                    assert response.status == 200, await response.text()
                    routed.add(response.headers[headers.POOL])
            assert await threshold() == 0.5  # the fixed one: no score counted yet
            assert routed == {"large"}  # each still routed by its score
            # The tokenized conversation went large, but was not remembered as having gone.
            later = {"messages": turns(OPENING, HARD_TEXT, "Thanks! Shorter?"), "max_tokens": 1}
            got, _ = await ask(session, gw.url, later)
            assert got[headers.TIER] == "small"
            for i in range(9):
                await ask(session, gw.url, {**EASY, "max_tokens": 1, "user": str(i)})
        assert await threshold() == float("inf")
        explained = await admin_route(gw.url, ADMIN_TOKEN, {"model": "auto", **EASY})
        assert explained["tier"]["threshold"] == "inf"  # JSON has no infinity
    finally:
        await gw.stop()


async def test_a_request_the_gateway_refuses_is_not_counted_in_the_calibration() -> None:
    """Hard requests refused while the large pool is down (and their clients' retries) served
    no pool: counted, they would raise the threshold for after its outage."""
    calibration = {"target_large_share": 0.0, "window": 10, "min_samples": 1}
    async with in_process_sims(1, "small-model") as small:
        async with in_process_gateway(large_pool_down(small, calibration)) as gateway:
            for _ in range(3):
                refused = await gateway.post(
                    "/v1/chat/completions", data=orjson.dumps({"model": "auto", **HARD})
                )
                assert refused.status == 503
            text = await (await gateway.get("/metrics")).text()
            assert metric(text, "gateway_tier_threshold") == 0.5  # the fixed one: none counted
            served = await gateway.post(
                "/v1/chat/completions", data=orjson.dumps({"model": "auto", **EASY})
            )
            assert served.status == 200
            text = await (await gateway.get("/metrics")).text()
    assert metric(text, "gateway_tier_threshold") == float("inf")  # one counted: calibrated


async def test_a_conversation_refused_its_large_turn_is_not_remembered_as_large() -> None:
    """A hard turn refused while the large pool is down never ran there: its conversation's
    next turn is routed by its own score, not kept large."""
    async with in_process_sims(1, "small-model") as small:
        async with in_process_gateway(large_pool_down(small)) as gateway:
            hard = {"model": "auto", "messages": turns(OPENING, HARD_TEXT), "max_tokens": 1}
            refused = await gateway.post("/v1/chat/completions", data=orjson.dumps(hard))
            assert refused.status == 503 and refused.headers[headers.TIER] == "large"
            later = {**hard, "messages": turns(OPENING, HARD_TEXT, "Thanks! Shorter?")}
            served = await gateway.post("/v1/chat/completions", data=orjson.dumps(later))
    assert served.status == 200 and served.headers[headers.TIER] == "small"


def large_pool_down(small: list[str], calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """Tier `auto` over the ``small`` replicas and a large pool whose one replica is down."""
    tier = {"small": "small", "large": "large"}
    return {
        "pools": {
            "small": {"model": "small-model", "replicas": small},
            "large": {"model": "large-model", "replicas": [f"http://127.0.0.1:{free_port()}"]},
        },
        "tiers": {"auto": tier if calibration is None else {**tier, "calibration": calibration}},
    }


async def test_overflow_starts_when_the_small_pool_saturates_and_stops_when_it_recovers(
    gateway: ManagedProcess,
) -> None:
    slow_easy = {**EASY, "max_tokens": 20}  # 20 tokens x 50 ms: each holds the small replica ~1 s
    async with aiohttp.ClientSession() as session:
        burst = await asyncio.gather(*(ask(session, gateway.url, slow_easy) for _ in range(5)))
        after, _ = await ask(session, gateway.url, EASY)
    pools = Counter(h[headers.POOL] for h, _ in burst)
    routes = Counter(h[headers.ROUTE] for h, _ in burst)
    # One request runs on the small replica and one waits in line (the saturation point);
    # the rest climb to the large pool, and say so.
    assert pools["small"] >= 1 and pools["large"] >= 2
    assert routes["overflow"] == pools["large"]
    assert {h[headers.TIER] for h, _ in burst} == {"small"}
    assert after[headers.POOL] == "small" and after[headers.ROUTE] != "overflow"


async def test_an_error_the_gateway_answers_for_a_classified_request_says_its_tier(
    pools: dict[str, ManagedProcess],
) -> None:
    policy = tiered_policy(pools)
    policy["pools"]["large"]["replicas"] = ["http://127.0.0.1:9"]  # nothing listens: down
    gw = await start_gateway(policy, env=FAST_PROBES, wait_path="/health")
    try:

        async def large_pool_down() -> bool:  # probed: refused by the gateway, not retried
            return (await get_text(f"{gw.url}/ready"))[0] == 503

        assert await eventually(large_pool_down)
        async with aiohttp.ClientSession() as session:
            hard = orjson.dumps({"model": "auto", **HARD})
            async with session.post(f"{gw.url}/v1/chat/completions", data=hard) as response:
                body = await response.json()
                assert response.status == 503
                assert body["error"]["code"] == "no_healthy_replica"
                assert response.headers[headers.POOL] == "large"
                assert response.headers[headers.TIER] == "large"
                assert float(response.headers[headers.TIER_SCORE]) > 0.5
            # Refused before it reaches a pool (a malformed hint): the tier is known all the same.
            easy = orjson.dumps({"model": "auto", **EASY})
            bad_hint = {headers.TTFT_OBJECTIVE: "soon"}
            async with session.post(
                f"{gw.url}/v1/chat/completions", data=easy, headers=bad_hint
            ) as response:
                assert response.status == 400
                assert response.headers[headers.TIER] == "small"
                assert headers.TIER_SCORE in response.headers
    finally:
        await gw.stop()
