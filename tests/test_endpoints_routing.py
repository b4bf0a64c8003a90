"""How the endpoints beyond chat are read and placed: pure tables of cases, no network.

- Every endpoint's body is checked for what routing reads (400 naming the field otherwise).
- /v1/responses fingerprints like the chat conversation it stands for; a completions batch like
  its first prompt; an adapter never like its base model.
- previous_response_id pins to the replica that stored the response, with an OpenAI error when
  that replica is gone; an adapter prefers the replicas that served it lately.
"""

from __future__ import annotations

import random
import time
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway import headers
from gateway.fleet.adapter_discovery import adapters_in, learned_for
from gateway.fleet.pools import Fleet
from gateway.http.errors import ApiError
from gateway.http.models_list import model_card, model_list
from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.affinity import (
    AdapterHomes,
    ReplicaRef,
    ResponseHomes,
    RouteHooks,
    RoutingMemory,
    adapter_replicas,
)
from gateway.routing.resolve import resolve
from router_policies.adapter_placement import AdapterSettings
from router_policies.fingerprint import canonical_chat, canonical_responses
from router_policies.schema import parse_policy
from tests.tiers import HARD
from tests.tiers import fleet as tier_fleet

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
NAMES = [u.removeprefix("http://") for u in URLS]
SYSTEM = "You are the harbour master's assistant. " * 20


def fleet(**pool: Any) -> Fleet:
    policy = {"pools": {"small": {"model": "m", "replicas": URLS, **pool}}}
    return Fleet(parse_policy(policy))


def parse(endpoint: Endpoint, body: dict[str, Any]) -> Any:
    return parse_request(endpoint, orjson.dumps(body))


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        (Endpoint.RESPONSES, {"model": "m"}, "input"),
        (Endpoint.RESPONSES, {"model": "m", "input": "x", "instructions": 3}, "instructions"),
        (
            Endpoint.RESPONSES,
            {"model": "m", "input": "x", "previous_response_id": 1},
            "previous_response_id",
        ),
        (Endpoint.EMBEDDINGS, {"model": "m", "input": []}, "input"),
        (Endpoint.SCORE, {"model": "m", "text_1": "a"}, "text_1"),
        (Endpoint.RERANK, {"model": "m", "documents": ["a"]}, "query"),
        (Endpoint.RERANK, {"model": "m", "query": "a", "documents": "b"}, "documents"),
        (Endpoint.TOKENIZE, {"model": "m"}, "prompt"),
        (Endpoint.DETOKENIZE, {"model": "m", "tokens": ["a"]}, "tokens"),
        (Endpoint.EMBEDDINGS, {"input": "x"}, "model"),
    ],
)
def test_a_body_routing_cannot_read_is_a_400_naming_the_field(
    endpoint: Endpoint, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as info:
        parse(endpoint, body)
    assert info.value.status == 400 and info.value.param == param


def test_tokenizer_endpoints_may_leave_the_model_out_when_one_is_served() -> None:
    parsed = parse(Endpoint.TOKENIZE, {"prompt": "hi"})
    assert parsed.model == ""
    assert resolve(fleet(), parsed, None).pool.name == "small"
    two = Fleet(
        parse_policy(
            {
                "pools": {
                    "a": {"model": "a", "replicas": URLS[:1]},
                    "b": {"model": "b", "replicas": URLS[1:]},
                }
            }
        )
    )
    with pytest.raises(ApiError) as info:
        resolve(two, parsed, None)
    assert info.value.status == 400 and info.value.param == "model"


def test_a_responses_conversation_fingerprints_like_the_same_chat() -> None:
    chat = canonical_chat(
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": "Where is it?"}]},
            {"role": "assistant", "content": "At sea."},
        ]
    )
    responses = canonical_responses(
        {
            "instructions": SYSTEM,
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Where is it?"}]},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "At sea."}],
                },
            ],
        }
    )
    assert responses == chat
    assert responses.lead_bytes > 0
    assert canonical_responses({"input": "Where?"}) == canonical_chat(
        [{"role": "user", "content": "Where?"}]
    )


def test_responses_requests_sharing_instructions_share_a_home() -> None:
    f = fleet()
    a = resolve(
        f, parse(Endpoint.RESPONSES, {"model": "m", "instructions": SYSTEM, "input": "a"}), None
    )
    b = resolve(
        f, parse(Endpoint.RESPONSES, {"model": "m", "instructions": SYSTEM, "input": "b"}), None
    )
    assert a.features.home_key == b.features.home_key
    assert a.features.block_hashes[0] == b.features.block_hashes[0]


def test_a_batch_of_prompts_is_fingerprinted_on_its_first() -> None:
    f = fleet()
    first = "Once upon a time in a harbour town " * 10
    batch = resolve(
        f, parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": [first, "other"]}), None
    )
    alone = resolve(f, parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": first}), None)
    assert batch.features.block_hashes == alone.features.block_hashes
    ids = resolve(f, parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": [[1, 2], [3]]}), None)
    assert (
        ids.features.block_hashes
        == resolve(
            f, parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": [1, 2]}), None
        ).features.block_hashes
    )


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (Endpoint.EMBEDDINGS, {"input": SYSTEM}),
        (Endpoint.SCORE, {"text_1": SYSTEM, "text_2": "b"}),
        (Endpoint.RERANK, {"query": SYSTEM, "documents": ["b"]}),
        (Endpoint.TOKENIZE, {"prompt": SYSTEM}),
    ],
)
def test_pooling_and_tokenizer_requests_go_by_load_alone(
    endpoint: Endpoint, body: dict[str, Any]
) -> None:
    resolution = resolve(fleet(), parse(endpoint, {"model": "m", **body}), None)
    assert resolution.features.block_hashes == ()
    decision = resolution.pool.decide(resolution.features)
    assert decision is not None and decision.route == "least-loaded"


def test_an_adapter_routes_to_its_pool_with_a_fingerprint_of_its_own() -> None:
    f = fleet(adapters=["sql-lora"])
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}]}
    base = resolve(f, parse(Endpoint.CHAT, {"model": "m", **body}), None)
    lora = resolve(f, parse(Endpoint.CHAT, {"model": "sql-lora", **body}), None)
    assert lora.pool.name == "small" and lora.parsed.model == "sql-lora"
    assert not set(lora.features.block_hashes) & set(base.features.block_hashes)
    with pytest.raises(ApiError) as info:
        resolve(f, parse(Endpoint.CHAT, {"model": "other-lora", **body}), None)
    assert info.value.status == 404


def test_an_adapter_name_must_not_be_another_pools_model() -> None:
    with pytest.raises(ValidationError, match="adapter 'b'"):
        parse_policy(
            {
                "pools": {
                    "a": {"model": "a", "replicas": URLS[:1], "adapters": ["b"]},
                    "b": {"model": "b", "replicas": URLS[1:]},
                }
            }
        )


def test_models_list_names_pools_adapters_and_tiers_as_vllm_does() -> None:
    policy = {
        "pools": {
            "small": {"model": "s", "replicas": URLS[:1], "adapters": ["s-lora"]},
            "large": {"model": "l", "replicas": URLS[1:]},
        },
        "tiers": {"auto": {"small": "small", "large": "large"}},
    }
    f = Fleet(parse_policy(policy))
    cards = {c["id"]: c for c in model_list(f)["data"]}
    assert list(cards) == ["s", "s-lora", "l", "auto"]
    assert cards["s-lora"]["parent"] == "s" and cards["s-lora"]["owned_by"] == "vllm"
    assert cards["auto"]["owned_by"] == "llm-gateway" and cards["auto"]["parent"] is None
    assert model_card(f, "l")["root"] == "l"
    with pytest.raises(ApiError) as info:
        model_card(f, "nope")
    assert info.value.status == 404 and info.value.code == "model_not_found"


# --- previous_response_id -------------------------------------------------------------------


def follow_up(response_id: str) -> Any:
    return parse(
        Endpoint.RESPONSES, {"model": "m", "input": "and?", "previous_response_id": response_id}
    )


def follow_up_refused(home: ReplicaRef, f: Fleet | None = None) -> ApiError:
    """The error a follow-up of `resp_1`, stored at ``home``, is answered with."""
    memory = RoutingMemory()
    memory.responses.remember("resp_1", home)
    with pytest.raises(ApiError) as info:
        resolve(f or fleet(), follow_up("resp_1"), None, memory)
    return info.value


def test_a_follow_up_is_pinned_to_the_replica_that_stored_its_response() -> None:
    f, memory = fleet(), RoutingMemory()
    memory.responses.remember("resp_1", ReplicaRef("small", NAMES[2]))
    hooks = resolve(f, follow_up("resp_1"), None, memory).hooks
    assert hooks is not None and hooks.pinned
    # Every attempt, retries included, keeps to that replica.
    for attempt in (0, 1):
        skip = hooks.exclude(NAMES, [], attempt)
        assert sorted(skip) == sorted(NAMES[:2])
    decision = f.pools["small"].decide(resolve(f, follow_up("resp_1"), None, memory).features, skip)
    assert decision is not None and decision.replica == NAMES[2]


def test_a_follow_up_whose_replica_left_the_pool_is_a_404() -> None:
    error = follow_up_refused(ReplicaRef("small", "10.9.9.9:8000"))
    assert (error.status, error.param, error.code) == (
        404, "previous_response_id", "previous_response_not_found"
    )  # fmt: skip
    assert "resp_1" in error.message


def test_a_follow_up_naming_another_pools_model_is_a_400_naming_the_pool_that_has_it() -> None:
    # vLLM keeps a response in its server's memory: no replica of this pool could continue it.
    error = follow_up_refused(ReplicaRef("large", "10.9.9.9:8000"))
    assert (error.status, error.param) == (400, "previous_response_id")
    assert "large" in error.message


def test_a_tier_models_follow_up_refused_says_its_tier_as_every_answer() -> None:
    built = tier_fleet()
    memory = RoutingMemory()
    memory.responses.remember("resp_1", ReplicaRef("large", "10.9.9.9:8000"))  # left its pool
    body = {"model": "auto", "input": HARD, "previous_response_id": "resp_1"}
    with pytest.raises(ApiError) as info:
        resolve(built, parse(Endpoint.RESPONSES, body), None, memory)
    assert info.value.status == 404
    sent = info.value.answer_headers()
    assert sent[headers.TIER] == "large" and float(sent[headers.TIER_SCORE]) > 0.5


@pytest.mark.parametrize("out", ["down", "ejected"])
def test_a_follow_up_whose_replica_is_out_is_a_503_to_retry(out: str) -> None:
    f = fleet()
    replica = f.pools["small"].replicas[NAMES[0]]
    if out == "down":
        replica.mark_down()
    else:  # up, but out of rotation after failures: no pool decision may send it there
        replica.outlier.ejected_until = time.monotonic() + 60
    error = follow_up_refused(ReplicaRef("small", NAMES[0]), f)
    assert error.status == 503 and error.code == "previous_response_unavailable"


def test_an_unknown_previous_response_is_left_to_the_replicas() -> None:
    hooks = resolve(fleet(), follow_up("resp_unknown"), None, RoutingMemory()).hooks
    assert hooks is not None and not hooks.pinned and hooks.exclude(NAMES, [], 0) == []


def test_the_response_id_is_learned_from_a_body_or_a_stream_split_anywhere() -> None:
    memory = RoutingMemory()
    body = b'{"id":"resp_abc","object":"response","previous_response_id":"resp_old"}'
    RouteHooks(memory, "small", learn_response_id=True).answered("r1", 200, body)
    assert memory.responses.get("resp_abc") == ReplicaRef("small", "r1")
    assert memory.responses.get("resp_old") is None
    stream = (
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_xyz",'
    )
    hooks = RouteHooks(memory, "small", learn_response_id=True)
    assert hooks.answered("r2", 200, stream[:70]) is True
    assert hooks.answered("r2", 200, stream[70:]) is False
    assert memory.responses.get("resp_xyz") == ReplicaRef("small", "r2")
    RouteHooks(memory, "small", learn_response_id=True).answered("r3", 404, b'{"id":"resp_e"}')
    assert memory.responses.get("resp_e") is None


def test_a_client_chosen_response_id_is_learned_as_vllm_answers_it() -> None:
    # vLLM answers a body's `request_id` as the response's id, whatever its shape.
    memory = RoutingMemory()
    body = b'{"id":"conv-42-turn-1","object":"response","output":[{"id":"msg_1"}]}'
    RouteHooks(memory, "small", learn_response_id=True).answered("r1", 200, body)
    assert memory.responses.get("conv-42-turn-1") == ReplicaRef("small", "r1")
    # One no path could name again is not stored, nor is a later id taken for it.
    body = b'{"id":"a b/c?","object":"response","output":[{"id":"msg_2"}]}'
    RouteHooks(memory, "small", learn_response_id=True).answered("r1", 200, body)
    assert memory.responses.get("msg_2") is None


@pytest.mark.parametrize(("store", "learned"), [({}, True), ({"store": True}, True), ({"store": False}, False)])  # fmt: skip
def test_a_response_is_remembered_only_where_it_is_stored(
    store: dict[str, bool], learned: bool
) -> None:
    # `store: false`: nothing to find again, so no home to keep (nor a Redis key for 24 h).
    memory = RoutingMemory()
    parsed = parse(Endpoint.RESPONSES, {"model": "m", "input": "hi", **store})
    hooks = resolve(fleet(), parsed, None, memory).hooks
    if hooks is not None:
        hooks.answered(NAMES[0], 200, b'{"id":"resp_1","object":"response"}')
    assert (memory.responses.get("resp_1") is not None) is learned


def test_response_homes_forget_the_least_recently_used() -> None:
    homes = ResponseHomes(capacity=2)
    for i in range(3):
        homes.remember(f"resp_{i}", ReplicaRef("p", "r"))
        if i == 1:
            homes.get("resp_0")  # used: kept over resp_1
    assert len(homes) == 2 and homes.get("resp_1") is None and homes.get("resp_0") is not None
    # A home the shared state overrules with counts as learned: the bound holds for it too.
    homes.overrule("resp_3", ReplicaRef("p", "r"))
    assert len(homes) == 2 and homes.get("resp_2") is None


# --- LoRA adapters --------------------------------------------------------------------------


PLACEMENT = AdapterSettings()


def test_a_cold_adapter_goes_to_its_rendezvous_home_then_stays_where_it_was_served() -> None:
    f, homes = fleet(adapters=["a"]), AdapterHomes()
    replicas = f.pools["small"].replicas.values()
    home = adapter_replicas(homes, "small", "a", replicas, PLACEMENT, now=0.0)
    assert len(home) == 1
    assert adapter_replicas(homes, "small", "a", replicas, PLACEMENT, now=1.0) == home
    homes.served("small", "a", NAMES[1], 5.0)
    assert adapter_replicas(homes, "small", "a", replicas, PLACEMENT, now=6.0) == {NAMES[1]}
    # Served long ago: no longer counted as loaded there.
    assert (
        adapter_replicas(homes, "small", "a", replicas, PLACEMENT, now=6.0 + PLACEMENT.warm_s)
        == home
    )


def test_an_adapters_warm_replicas_are_left_when_far_busier_than_the_pool() -> None:
    f, homes = fleet(adapters=["a"]), AdapterHomes()
    pool = f.pools["small"]
    homes.served("small", "a", NAMES[0], 0.0)
    pool.replicas[NAMES[0]].inflight = 5
    assert (
        adapter_replicas(homes, "small", "a", pool.replicas.values(), PLACEMENT, now=1.0) == set()
    )
    pool.replicas[NAMES[0]].inflight = 1
    assert adapter_replicas(homes, "small", "a", pool.replicas.values(), PLACEMENT, now=1.0) == {
        NAMES[0]
    }


def test_an_adapter_preference_holds_for_the_first_attempt_only() -> None:
    memory = RoutingMemory()
    f = fleet(adapters=["a"])
    hooks = resolve(
        f, parse(Endpoint.COMPLETIONS, {"model": "a", "prompt": "x"}), None, memory
    ).hooks
    assert hooks is not None and len(hooks.replicas) == 1 and not hooks.pinned
    assert len(hooks.exclude(NAMES, [], 0)) == 2
    assert hooks.exclude(NAMES, ["x"], 1) == ["x"]
    hooks.answered(NAMES[2], 200, b"{}")
    assert memory.adapters.warm("small", "a", time.monotonic(), PLACEMENT.warm_s) == {NAMES[2]}


def test_adapters_are_learned_from_model_lists_but_never_shadow_a_declared_name() -> None:
    cards = {
        "object": "list",
        "data": [
            {"id": "m", "parent": None},
            {"id": "a-lora", "parent": "m"},
            {"id": "x-lora", "parent": "other-model"},
            {"id": 7, "parent": "m"},
        ],
    }
    assert adapters_in(cards, "m") == {"a-lora"}
    assert adapters_in({"data": "nonsense"}, "m") == set()
    f = fleet(adapters=["declared"])
    learned = learned_for(f, {"small": {"a-lora", "declared", "m"}})
    assert learned == {"small": frozenset({"a-lora"})}
    memory = RoutingMemory(learned_adapters=learned)
    f.pools["small"].replicas[NAMES[0]].adapters = frozenset({"a-lora"})  # the one listing it
    parsed = parse(Endpoint.COMPLETIONS, {"model": "a-lora", "prompt": "x"})
    assert resolve(f, parsed, None, memory).pool.name == "small"
    with pytest.raises(ApiError):
        resolve(f, parsed, None)  # not learned: unknown
    assert [c["id"] for c in model_list(f, learned)["data"]] == ["m", "declared", "a-lora"]


_ODD: list[Any] = [
    None, True, 0, -1, 2**40, 1.5, "", "x", "resp_1", [], [1, 2], [[1], [2]], ["a", "b"], [None],
    {}, {"a": 1}, [{"type": "message", "role": 3}], [{"role": "user", "content": [{"type": 1}]}],
    [{"type": "function_call_output", "output": {"x": [1]}}], [7, "a", {"b": None}],
]  # fmt: skip
_FIELDS = [
    "model", "input", "instructions", "previous_response_id", "tools", "prompt", "messages",
    "query", "documents", "top_n", "text_1", "text_2", "tokens", "stream", "n",
]  # fmt: skip


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_no_body_however_odd_gets_past_the_checks_into_an_unhandled_error(
    endpoint: Endpoint,
) -> None:
    rng = random.Random(endpoint.value)
    f, memory = fleet(adapters=["a"]), RoutingMemory()
    memory.responses.remember("resp_1", ReplicaRef("small", NAMES[0]))
    for _ in range(400):
        body = {name: rng.choice(_ODD) for name in rng.sample(_FIELDS, rng.randint(1, 8))}
        if rng.random() < 0.7:
            body["model"] = rng.choice(["m", "a"])
        try:
            resolve(f, parse(endpoint, body), None, memory)
        except ApiError as exc:
            assert 400 <= exc.status < 500
