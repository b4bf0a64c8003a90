"""A client can name the conversation a request belongs to (a header, or OpenAI's
`prompt_cache_key` or `user`) and its own time-to-first-token objective: the session goes back
to its replica while that replica is not predicted slower than a cold start elsewhere."""

from __future__ import annotations

from dataclasses import replace

import pytest
from openai import AsyncOpenAI, BadRequestError

from gateway import headers
from gateway.http.errors import ApiError
from gateway.routing.client_hints import session_key, ttft_objective_s
from router_policies.decision import Decision, Route
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures
from router_policies.policies.prefix_aware import PrefixAware
from router_policies.schema import PoolPolicy
from router_policies.session_settings import SessionSettings
from router_policies.sessions import Sessions
from tests.conftest import (
    MODEL,
    in_process_gateway,
    in_process_sims,
    pool_policy,
    running_gateway,
    running_sims,
)
from tests.routing import (
    FEATURES,
    HOME,
    NAMES,
    POOL,
    SECOND,
    candidate,
    choose,
    features,
    holding,
    snapshot,
)

UNIQUE = features(CanonicalPrompt(b"q" * 4096))  # its own text: no replica holds any of it


def in_session(name: str = "conv-1") -> RequestFeatures:
    return replace(UNIQUE, session=name)


class TestTheDecision:
    def test_a_session_goes_back_to_its_replica_with_a_prompt_held_nowhere(self) -> None:
        policy = holding()
        first = choose(policy, snapshot(), in_session())
        policy.record(in_session(), first, now=0.0)
        # The others are quieter now, and the prompt is new text: by load it would move.
        busy = candidate(first.replica, running=3.0, recent=5.0)
        again = choose(policy, snapshot(busy), in_session())
        assert (again.replica, again.route) == (first.replica, Route.SESSION)

    def test_it_moves_when_a_cold_start_elsewhere_is_predicted_sooner(self) -> None:
        policy = holding()
        policy.record(in_session(), choose(policy, snapshot(), in_session()), now=0.0)
        (home,) = [n for n in NAMES if policy.sessions.home("conv-1") == n]
        swamped = candidate(home, pending_prefill_tokens=200_000.0, pending_requests=20)
        moved = choose(policy, snapshot(swamped), in_session())
        assert moved.replica != home and moved.route is not Route.SESSION
        policy.record(in_session(), moved, now=1.0)
        assert policy.sessions.home("conv-1") == moved.replica  # and it stays where it went

    def test_a_key_with_more_than_a_replicas_share_of_the_traffic_is_not_pinned(self) -> None:
        # An app that sends one prompt_cache_key (or user) with all of its requests, beside a
        # conversation that sends its own.
        policy = holding()
        app, conversation = replace(FEATURES, session="app"), in_session("conv-1")
        for i in range(40):
            policy.record(app, Decision(HOME, Route.PREFIX_HIT), now=i * 0.01)
        policy.record(conversation, Decision(SECOND, Route.LEAST_LOADED), now=0.4)
        busy = [candidate(n, running=3.0, recent=5.0) for n in (HOME, SECOND)]
        spread = choose(policy, snapshot(*busy, now=0.5), app)
        assert spread.replica not in (HOME, SECOND)  # a hot prefix, warm on the quiet ones
        kept = choose(policy, snapshot(*busy, now=0.5), conversation)
        assert (kept.replica, kept.route) == (SECOND, Route.SESSION)

    def test_a_session_whose_replica_left_is_routed_as_any_request(self) -> None:
        policy = holding()
        policy.sessions.bind("conv-1", "gone", capacity=10)
        decision = choose(policy, snapshot(), in_session())
        assert decision.route is not Route.SESSION

    def test_sessions_are_forgotten_least_recently_used_first(self) -> None:
        sessions = Sessions(half_life_s=30.0)
        for name in ("x", "y", "z"):
            sessions.bind(name, "a", capacity=2)
        assert (sessions.home("x"), sessions.home("z"), len(sessions)) == (None, "a", 2)

    def test_a_reload_built_and_then_refused_leaves_the_running_bound_as_it_was(self) -> None:
        running = holding()
        # A reload builds the pool's new policy before all of the file is known to load.
        one = PoolPolicy(model="m", replicas=POOL.replicas, session=SessionSettings(max_sessions=1))
        PrefixAware(one, previous=running)
        for name in ("x", "y"):
            running.record(in_session(name), choose(running, snapshot(), in_session(name)), 0.0)
        assert len(running.sessions) == 2

    def test_max_sessions_zero_remembers_none(self) -> None:
        pool = PoolPolicy(
            model="m", replicas=POOL.replicas, session=SessionSettings(max_sessions=0)
        )
        policy = holding(pool=pool)
        policy.record(in_session(), choose(policy, snapshot(), in_session()), now=0.0)
        assert len(policy.sessions) == 0

    def test_a_requests_own_objective_turns_the_late_rule_on(self) -> None:
        policy = holding()
        loaded = [candidate(n, pending_prefill_tokens=50_000.0, pending_requests=5) for n in NAMES]
        assert choose(policy, snapshot(*loaded)).route is not Route.LATE  # the pool sets none
        hurried = replace(UNIQUE, ttft_objective_s=0.2)  # its own prefill alone: ~0.1 s
        assert choose(policy, snapshot(*loaded), hurried).route is Route.LATE


class TestWhatTheClientSays:
    SETTINGS = SessionSettings()

    def test_the_header_comes_first_then_prompt_cache_key_then_user(self) -> None:
        body = {"prompt_cache_key": "pck", "user": "alice"}
        assert session_key(body, {"x-session-id": "s1"}, self.SETTINGS) == "s1"
        assert session_key(body, {}, self.SETTINGS) == "pck"
        assert session_key({"user": "alice"}, {}, self.SETTINGS) == "alice"
        assert session_key({"user": 7}, {}, self.SETTINGS) == ""  # not a string: no session

    def test_a_long_key_is_kept_as_its_digest(self) -> None:
        key = session_key({"user": "u" * 5000}, {}, self.SETTINGS)
        assert 0 < len(key) <= 256 and key == session_key({"user": "u" * 5000}, {}, self.SETTINGS)

    def test_the_objective_header_in_ms_and_llm_ds_name_for_it(self) -> None:
        assert ttft_objective_s({headers.TTFT_OBJECTIVE: "250"}) == 0.25
        assert ttft_objective_s({headers.TTFT_OBJECTIVE_LLMD: "1500"}) == 1.5
        assert ttft_objective_s({}) is None
        for bad in ("0", "-3", "nan", "soon", "1e12"):
            with pytest.raises(ApiError, match=headers.TTFT_OBJECTIVE):
                ttft_objective_s({headers.TTFT_OBJECTIVE: bad})


async def test_a_users_requests_stay_on_one_replica_through_the_gateway() -> None:
    async with in_process_sims(3) as urls, in_process_gateway(pool_policy(urls)) as gateway:
        client = AsyncOpenAI(base_url=f"{gateway.make_url('/v1')}", api_key="x", max_retries=0)
        seen = set()
        for turn in range(5):
            answer = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Question {turn}: " + "why? " * 40 * turn}],
                max_tokens=4,
                user="alice",
            )
            seen.add((answer.headers[headers.REPLICA], answer.headers[headers.ROUTE]))
            if turn == 0:
                assert answer.headers[headers.ROUTE] != Route.SESSION
        replicas = {replica for replica, _ in seen}
        assert len(replicas) == 1, seen
        assert (replicas.pop(), Route.SESSION.value) in seen
        with pytest.raises(BadRequestError, match=headers.TTFT_OBJECTIVE):
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={headers.TTFT_OBJECTIVE: "soon"},
            )


async def test_a_requests_own_objective_reaches_the_routing_of_a_real_gateway() -> None:
    """Real processes: with an objective no replica can meet (1 ms, under one engine step)
    for a prompt whose own prefill is shorter, the request is routed by the late rule;
    without one, by its prefix."""
    async with running_sims(2) as sims, running_gateway([s.url for s in sims]) as gateway:
        client = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
        routes = []
        for objective in (None, "1"):
            extra = {} if objective is None else {headers.TTFT_OBJECTIVE: objective}
            answer = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Harbours?"}],
                max_tokens=2,
                extra_headers=extra,
            )
            routes.append(answer.headers[headers.ROUTE])
    assert routes[0] != Route.LATE and routes[1] == Route.LATE
