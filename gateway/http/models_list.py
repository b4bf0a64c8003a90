"""`GET /v1/models` and `GET /v1/models/{id}`: what the fleet serves, in vLLM's model cards.

vLLM lists its base model (`root`: where it was loaded from, `parent`: null) and each LoRA
adapter (`parent`: the base model). The gateway lists every pool's model and adapters the same
way (it knows names, not paths: `root` is the served name), and each tier name, whose `parent`
is null and `owned_by` is the gateway: a client choosing a model sees everything it may name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.fleet.pools import Fleet
from gateway.http.errors import model_not_found

OWNED_BY_REPLICAS = "vllm"
OWNED_BY_GATEWAY = "llm-gateway"


def _card(model: str, owned_by: str, root: str, parent: str | None) -> dict[str, Any]:
    return {
        "id": model,
        "object": "model",
        "created": 0,
        "owned_by": owned_by,
        "root": root,
        "parent": parent,
    }


Learned = Mapping[str, frozenset[str]]
"""Pool name -> adapters learned from its replicas (gateway/fleet/adapter_discovery.py)."""


def model_cards(fleet: Fleet, learned: Learned | None = None) -> list[dict[str, Any]]:
    cards = []
    for name, pool in fleet.pools.items():
        cards.append(_card(pool.model, OWNED_BY_REPLICAS, pool.model, None))
        adapters = [*pool.policy.adapters, *sorted((learned or {}).get(name, ()))]
        cards.extend(_card(a, OWNED_BY_REPLICAS, a, pool.model) for a in adapters)
    cards.extend(_card(tier, OWNED_BY_GATEWAY, tier, None) for tier in fleet.tiers)
    return cards


def model_list(fleet: Fleet, learned: Learned | None = None) -> dict[str, Any]:
    return {"object": "list", "data": model_cards(fleet, learned)}


def model_card(fleet: Fleet, model: str, learned: Learned | None = None) -> dict[str, Any]:
    """The card of `model`; ApiError 404 (model_not_found) when the fleet does not serve it."""
    for card in model_cards(fleet, learned):
        if card["id"] == model:
            return card
    raise model_not_found(model)
