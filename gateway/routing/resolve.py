"""From the model a client names to a pool: a pool's own model, one of its LoRA adapters, or a
tier classified into one; and where in the pool the request must or should go."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping

from gateway import headers
from gateway.fleet.pools import Fleet, PoolState, ReplicaState
from gateway.http.errors import (
    ApiError,
    WithHeaders,
    bad_request,
    model_not_found,
    stored_response_unavailable,
)
from gateway.http.request_body import Endpoint, ParsedRequest, with_member
from gateway.routing.affinity import RouteHooks, RoutingMemory, adapter_replicas
from gateway.routing.client_hints import forced_tier
from router_policies.cost.ttft import IDLE, predicted_s
from router_policies.decision import Route
from router_policies.fingerprint import RequestFeatures, load_only
from router_policies.tier_router import TierRouter, TierVerdict
from router_policies.tier_settings import TierSettings
from router_policies.tiers import (
    PoolChoice,
    PoolLoad,
    PoolPrediction,
    choose_pool,
    climb_choice,
    close_call_choice,
    is_close_call,
    may_climb,
)
from router_policies.value import value

Compared = tuple[tuple[str, PoolPrediction | None], ...]
"""The predictions by pool a rule read, the tier's pool first."""
Rule = Callable[
    [PoolChoice, TierSettings, PoolPrediction | None, PoolPrediction | None, PoolLoad, float],
    PoolChoice,
]
_RULES: dict[Route, Rule] = {Route.CLOSE_CALL: close_call_choice, Route.OVERFLOW: climb_choice}
"""The rules that choose between the pools by their predictions, by the route they give."""


@value
class Resolution:
    parsed: ParsedRequest
    """As forwarded: a tiered request's `model` is rewritten to the chosen pool's model."""
    pool: PoolState
    features: RequestFeatures
    verdict: TierVerdict | None = None
    choice: PoolChoice | None = None
    tier_router: TierRouter | None = None
    hooks: RouteHooks | None = None
    """Placement beyond the pool's policy (a stored response, an adapter's warm replicas)."""
    compared: Compared = ()
    """The predictions by pool that a close call or a predicted climb read, the tier's pool
    first (/admin/route shows them)."""
    compared_for: Route | None = None
    """Which of the two read them: Route.CLOSE_CALL or Route.OVERFLOW."""

    @property
    def route(self) -> Route | None:
        if self.choice is None:
            return None
        if self.choice.overflow:
            return Route.OVERFLOW
        return Route.CLOSE_CALL if self.choice.close_call else None

    def answer_route(self, decided: Route) -> Route:
        """Why the request went where it did, as its answer says (x-gateway-route) and the dry
        run (/admin/route) reports: a follow-up pinned to its stored response's replica, else
        the resolution's route (e.g. overflow) over the replica decision's ``decided``."""
        if self.hooks is not None and self.hooks.pinned:
            # The policy chose among the one replica left to it: its own route would misstate
            # why the follow-up went there.
            return Route.PINNED
        return self.route or decided

    def response_headers(self) -> dict[str, str]:
        return {} if self.verdict is None else tier_headers(self.verdict)


def tier_headers(verdict: TierVerdict) -> dict[str, str]:
    """What an answer to a classified request says of its tier (a replica's, or an error)."""
    return {headers.TIER: verdict.tier.value, headers.TIER_SCORE: f"{verdict.score.score:.3f}"}


def adapter_pool(
    fleet: Fleet, model: str, learned: Mapping[str, frozenset[str]] | None = None
) -> PoolState | None:
    """The pool one of whose LoRA adapters is named `model`: declared in the policy (which
    keeps names unique), else learned from its replicas' model lists."""
    for pool in fleet.pools.values():
        if model in pool.policy.adapters:
            return pool
    for name, adapters in (learned or {}).items():
        if model in adapters and name in fleet.pools:
            return fleet.pools[name]
    return None


def resolve(
    fleet: Fleet,
    parsed: ParsedRequest,
    tier_header: str | None,
    memory: RoutingMemory | None = None,
) -> Resolution:
    """``tier_header``: the client's x-gateway-tier, read only for a tier model whose policy
    lets clients force the tier; raises ApiError for what it refuses."""
    if not parsed.model:
        # /tokenize and /detokenize may leave the model out, as a single vLLM server allows.
        if len(fleet.pools) != 1:
            raise bad_request(
                "'model' is required: the gateway serves more than one model.", param="model"
            )
        only = next(iter(fleet.pools.values()))
        return Resolution(parsed, only, load_only(only.model))
    pool = fleet.pool_for_model(parsed.model)
    adapter = None
    verdict = choice = tier_router = compared_for = None
    compared: Compared = ()
    features: RequestFeatures | None = None
    if pool is None:
        pool = adapter_pool(fleet, parsed.model, memory.learned_adapters if memory else None)
        adapter = parsed.model if pool is not None else None
    if pool is None:
        tier_router = fleet.tiers.get(parsed.model)
        if tier_router is None:
            raise model_not_found(parsed.model)
        settings = tier_router.settings
        verdict = tier_router.classify(parsed.body, forced_tier(tier_header, settings))
        stored = _stored_in(memory, parsed, settings)
        if stored is not None:
            choice = PoolChoice(stored, overflow=False, stored=True)
        else:
            overflow = settings.overflow
            small = fleet.pools[settings.small].load(
                backlog=overflow.enabled and overflow.predicted
            )
            choice = choose_pool(verdict.tier, settings, small, fleet.pools[settings.large].load())
            compared_for = _comparison(verdict, choice, settings, small)
            if compared_for is not None:
                rule = _RULES[compared_for]
                choice, features, compared = _compare(rule, choice, settings, fleet, parsed)
        pool = fleet.pools[choice.pool]
        raw = with_member(parsed.raw, "model", pool.model)  # the client's bytes, but the model
        body = {**parsed.body, "model": pool.model}
        parsed = dataclasses.replace(parsed, body=body, raw=raw, model=pool.model)
    if features is None:
        salt = parsed.cache_salt if adapter is None else f"{parsed.cache_salt}\x00lora:{adapter}"
        features = _features(pool, parsed, parsed.model, salt)
    try:
        hooks = _hooks(memory, pool, parsed, adapter) if memory is not None else None
    except ApiError as refused:
        if verdict is None:
            raise
        raise WithHeaders(refused, tier_headers(verdict)) from refused  # as every answer
    return Resolution(
        parsed, pool, features, verdict, choice, tier_router, hooks, compared, compared_for
    )


def _stored_in(
    memory: RoutingMemory | None, parsed: ParsedRequest, settings: TierSettings
) -> str | None:
    """The tier's pool that stores the response ``previous_response_id`` names, if known: a
    vLLM server keeps its responses in its own memory, so no other pool could continue."""
    previous = parsed.previous_response_id
    home = memory.responses.get(previous) if memory is not None and previous else None
    if home is not None and home.pool in (settings.small, settings.large):
        return home.pool
    return None


def _comparison(
    verdict: TierVerdict, choice: PoolChoice, settings: TierSettings, small: PoolLoad
) -> Route | None:
    """Which rule, if any, reads both pools' predictions for this request: a close call's, or
    an easy request's climb while the small pool has a queue. A forced tier, a conversation
    gone large before (whatever this turn scores) and overflow at saturation are neither."""
    if choice.overflow or verdict.forced:
        return None
    score, threshold = verdict.score.score, verdict.threshold
    if not verdict.remembered and is_close_call(score, threshold, settings.close_call_margin):
        return Route.CLOSE_CALL
    return Route.OVERFLOW if may_climb(verdict.tier, settings, small) else None


def _features(pool: PoolState, parsed: ParsedRequest, model: str, salt: str) -> RequestFeatures:
    if not parsed.endpoint.prefix_routed:
        return load_only(model)
    # An adapter's KV cache is its own: the adapter salts the fingerprint (its name is also
    # the model the chain is seeded with), so no prefix matches across adapters.
    return pool.router.features(model, parsed.canonical_text, salt)


def _compare(
    rule: Rule, choice: PoolChoice, settings: TierSettings, fleet: Fleet, parsed: ParsedRequest
) -> tuple[PoolChoice, RequestFeatures, Compared]:
    """The pool ``rule`` chooses from each pool's prediction for the request as its policy
    would route it now; the request's features in that pool; the predictions."""
    pools = (fleet.pools[choice.pool], fleet.pools[settings.other_pool(choice.pool)])
    features = [_features(pool, parsed, pool.model, parsed.cache_salt) for pool in pools]
    own, other = (_predict(pool, seen) for pool, seen in zip(pools, features, strict=True))
    near = pools[0].policy.cost.near_ratio
    chosen = rule(choice, settings, own, other, pools[1].load(), near)
    compared = ((pools[0].name, own), (pools[1].name, other))
    return chosen, features[0] if chosen is choice else features[1], compared


def _predict(pool: PoolState, features: RequestFeatures) -> PoolPrediction | None:
    """None for a policy without a cost model (no estimate, no candidate costs)."""
    decision = pool.decide(features, explain=True)
    if decision is None or decision.estimate is None:
        return None
    chosen = next((c for c in decision.costs if c.name == decision.replica), None)
    if chosen is None:
        return None
    prompt_tokens = features.hashed_bytes / pool.learned.chars_per_token
    idle_cold = predicted_s(IDLE, prompt_tokens, prompt_tokens, chosen.rates)
    return PoolPrediction(decision.estimate.total_s, idle_cold)


def _hooks(
    memory: RoutingMemory, pool: PoolState, parsed: ParsedRequest, adapter: str | None
) -> RouteHooks | None:
    # `store: false`: nothing to find again, so no home (nor its Redis key, 24 h) to keep.
    learn = parsed.endpoint is Endpoint.RESPONSES and parsed.body.get("store") is not False
    previous = parsed.previous_response_id
    if previous is not None:
        home = memory.responses.get(previous)
        if home is not None and home.pool != pool.name:  # no replica of this pool holds it
            raise ApiError(
                400,
                f"Response with id '{previous}' was stored by another model (pool "
                f"{home.pool}): continue it with that model, or start over without "
                "previous_response_id.",
                param="previous_response_id", code="previous_response_not_found",
            )  # fmt: skip
        if home is not None:
            replica = pool.replicas.get(home.replica)
            if replica is None:
                raise ApiError(
                    404,
                    f"Response with id '{previous}' not found: replica {home.replica}, which "
                    "stored it, has left the pool.",
                    param="previous_response_id", code="previous_response_not_found",
                )  # fmt: skip
            if not replica.available(time.monotonic()):  # down, or ejected after failures
                raise stored_response_unavailable(
                    f"Response with id '{previous}' is stored on replica {home.replica}, which "
                    "is not available now; retry later, or start over without "
                    "previous_response_id.",
                    "previous_response_id",
                )
            return RouteHooks(memory, pool.name, frozenset((home.replica,)), True, adapter, learn)
        # Unknown here (forgotten, or served through another gateway): the pool's policy
        # chooses, and a replica without it answers vLLM's own 404.
    if adapter is None:
        return RouteHooks(memory, pool.name, learn_response_id=learn) if learn else None
    required = _serving(pool, adapter)
    candidates: Iterable[ReplicaState] = pool.replicas.values()
    if required:
        candidates = [pool.replicas[name] for name in required]
    # One at its in-flight limit is no preference: the request would wait for a slot there.
    candidates = [r for r in candidates if pool.has_slot(r)]
    replicas = adapter_replicas(
        memory.adapters, pool.name, adapter, candidates, pool.policy.adapter_placement
    )
    # Among the replicas that list it, the warm one or its home, else the least busy of them:
    # far busier or not, no other replica has the adapter to serve.
    return RouteHooks(
        memory, pool.name, replicas or required, False, adapter, learn, required=required
    )


def _serving(pool: PoolState, adapter: str) -> frozenset[str]:
    """The replicas an adapter's request must stay among: those that list it, while one of
    them is available; empty: any replica of the pool. A declared adapter none lists goes
    anywhere (vLLM may load it on demand: VLLM_ALLOW_RUNTIME_LORA_UPDATING with a resolver);
    a learned one is served only where it is listed, so with none available: a 503."""
    now = time.monotonic()
    listing = [r for r in pool.replicas.values() if adapter in r.adapters]
    if any(r.available(now) for r in listing):
        return frozenset(r.name for r in listing)
    if adapter in pool.policy.adapters:
        return frozenset()
    raise ApiError(
        503,
        f"No healthy replica in pool {pool.name!r} serves the adapter {adapter!r} now; retry "
        "later.",
        type_="service_unavailable_error", param="model", code="no_healthy_replica",
    )  # fmt: skip
