"""Shared helpers of the tier tests: a fleet of a small and a large pool of one replica each
behind the tier model `auto`, requests to it, conversations and their turns, load on a pool, and
running small and large pools behind `auto` and their policy."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.fleet.pools import Fleet
from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.resolve import Resolution, resolve
from replica.processes import ManagedProcess
from router_policies.decision import Route
from router_policies.schema import parse_policy
from router_policies.tier_memory import continues, conversation_keys
from tests.conftest import running_sims

EASY = "What is the capital of France?"
HARD = (
    "Prove step by step that the integral of $e^{-x^2}$ over the real line is $\\sqrt{\\pi}$, "
    "then compare two derivations and justify which is more rigorous."
)
# A conversation's turns: an opening with no task yet, and a follow-up that, read alone, is easy.
OPENING = "Hi! I have a few questions for you today."
EASY_FOLLOW_UP = "Thanks! And what is the capital of France?"
SLOW = {"prefill_tokens_per_s": 2000.0, "step_s": 0.04}
"""A large model's starting rates: slower at everything than the default small one's."""


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}], **extra}


def dialogue(*users: str) -> dict[str, Any]:
    """A conversation's request: its user turns, each answered but the last."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are helpful."}]
    for i, text in enumerate(users):
        if i:
            messages.append({"role": "assistant", "content": "Here you go."})
        messages.append({"role": "user", "content": text})
    return {"messages": messages}


def as_responses(chat: dict[str, Any]) -> dict[str, Any]:
    """The same conversation as a /v1/responses body: the system message as `instructions`,
    the turns as input items."""
    system, *turns = chat["messages"]
    return {"instructions": system["content"], "input": turns}


def conversation_key(body: dict[str, Any]) -> int | None:
    """The key a request's conversation is remembered under when it goes large."""
    keys = conversation_keys(body)
    return keys[-1] if keys else None


def follow_up(body: dict[str, Any]) -> bool:
    """Whether a request continues a conversation (router_policies/tier_memory.py)."""
    return continues(conversation_keys(body))


def fleet(
    margin: float = 0.0,
    large_cost: dict[str, float] | None = None,
    overflow: dict[str, bool] | None = None,
    small_replicas: int = 1,
) -> Fleet:
    pool = {"max_inflight_per_replica": 64}
    smalls = [f"http://10.0.0.1:{8000 + i}" for i in range(small_replicas)]
    large = {"cost": large_cost} if large_cost else {}
    tier: dict[str, Any] = {"small": "small", "large": "large", "close_call_margin": margin}
    if overflow is not None:
        tier["overflow"] = overflow
    policy = parse_policy(
        {
            "pools": {
                "small": {"model": "s", "replicas": smalls, **pool},
                "large": {"model": "l", "replicas": ["http://10.0.0.2:8000"], **pool, **large},
            },
            "tiers": {"auto": tier},
        }
    )
    built = Fleet(policy)
    for _, replica in built.replicas():
        replica.record_probe(True, unhealthy_after=1, healthy_after=1)
    return built


def resolved(built: Fleet, text: str, tier: str | None = None) -> Resolution:
    body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    resolution = resolve(built, parse_request(Endpoint.CHAT, orjson.dumps(body)), tier)
    assert resolution.verdict is not None
    return resolution


def ask(built: Fleet, text: str, **headers: Any) -> tuple[str, Route | None, str]:
    resolution = resolved(built, text, headers.get("tier"))
    assert resolution.verdict is not None  # for the type checker: resolved() checked it
    return resolution.pool.name, resolution.route, resolution.verdict.tier.value


def busy(built: Fleet, pool: str, pending: int = 40) -> None:
    """40 requests in flight on each replica of ``pool``, ``pending`` of them waiting for their
    first token."""
    for replica in built.pools[pool].replicas.values():
        replica.inflight = 40
        replica.pending_requests = pending
        replica.pending_prefill_tokens = pending * 500  # their prompts, not yet prefilled


@contextlib.asynccontextmanager
async def small_and_large() -> AsyncIterator[dict[str, ManagedProcess]]:
    """One simulated replica serving `small-model` and one serving `large-model`, by pool."""
    async with (
        running_sims(1, "small-model") as [small],
        running_sims(1, "large-model") as [large],
    ):
        yield {"small": small, "large": large}


def two_pools(pools: dict[str, ManagedProcess], **tier: Any) -> dict[str, Any]:
    """The pools `small` and `large` of one replica each behind the tier `auto`, every other
    setting the default."""
    return {
        "pools": {
            name: {"model": f"{name}-model", "replicas": [pools[name].url]}
            for name in ("small", "large")
        },
        "tiers": {"auto": {"small": "small", "large": "large", **tier}},
    }


def tiered_policy(pools: dict[str, ManagedProcess], **tier: Any) -> dict[str, Any]:
    """two_pools with a small pool saturated by one request, and a large tensor-parallel one."""
    policy = two_pools(pools, **tier)
    policy["pools"]["small"].update(max_inflight_per_replica=1, saturation_queue_per_replica=1)
    policy["pools"]["large"]["tensor_parallel_size"] = 2
    return policy
