"""LoRA adapters learned from the replicas' own `GET /v1/models`, beside those a pool declares.

vLLM lists each adapter it serves (from `--lora-modules`, or loaded at runtime) as a model card
whose `parent` is the base model. A pool that learns an adapter this way serves it without a
policy edit. Each replica keeps its own list (`ReplicaState.adapters`): vLLM answers 404 for an
adapter it does not serve, so routing sends an adapter only to the replicas that list it.
Background work, never on the request path; a replica that does not answer keeps its last list.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import aiohttp
import orjson

from gateway import headers
from gateway.fleet.monitor import read_at_most
from gateway.fleet.pools import Fleet, PoolState, ReplicaState

log = logging.getLogger(__name__)

ROUNDS_PER_SCRAPE = 10
"""Adapters change far more rarely than load: one listing per 10 metrics scrapes."""
_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


def adapters_in(cards: object, base_model: str) -> set[str]:
    """The adapter names in a /v1/models body: cards whose parent is `base_model`."""
    data = cards.get("data") if isinstance(cards, Mapping) else None
    if not isinstance(data, list):
        return set()
    return {
        card["id"]
        for card in data
        if isinstance(card, Mapping)
        and isinstance(card.get("id"), str)
        and card.get("parent") == base_model
        and card["id"] != base_model
    }


def learned_for(fleet: Fleet, found: Mapping[str, set[str]]) -> dict[str, frozenset[str]]:
    """Per pool, the adapters its replicas list that no pool declares and that are no model or
    tier name: a declared name, or the first pool to list one, keeps it."""
    taken = set(fleet.models())
    for pool in fleet.pools.values():
        taken.update(pool.policy.adapters)
    learned: dict[str, frozenset[str]] = {}
    for name, names in found.items():
        fresh = frozenset(names - taken)
        taken |= fresh
        learned[name] = fresh
    return learned


async def _list(session: aiohttp.ClientSession, pool: PoolState, replica: ReplicaState) -> None:
    try:
        async with session.get(
            f"{replica.url}/v1/models", timeout=_TIMEOUT, headers=headers.UNCOMPRESSED
        ) as response:
            if response.status != 200:
                return
            listed = adapters_in(orjson.loads(await read_at_most(response)), pool.model)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # ValueError: not JSON, too long
        log.debug("no model list from %s: %r", replica.name, exc)
        return
    replica.adapters = frozenset(listed)


async def discover_once(
    fleet: Fleet, session: aiohttp.ClientSession, learned: dict[str, frozenset[str]]
) -> None:
    """Updates each healthy replica's adapters, and `learned` (pool name -> adapter names any
    of its replicas lists, unhealthy ones included: their requests get a 503 that names the
    adapter rather than an unknown model) in place, from one round of listings."""
    for pool in fleet.pools.values():
        for replica in pool.healthy():
            await _list(session, pool, replica)
    found = {
        name: set[str]().union(*(r.adapters for r in pool.replicas.values()))
        for name, pool in fleet.pools.items()
    }
    fresh = learned_for(fleet, found)
    learned.clear()
    learned.update(fresh)


async def discover_forever(
    fleet: Callable[[], Fleet],
    session: aiohttp.ClientSession,
    learned: dict[str, frozenset[str]],
    interval_s: float,
) -> None:
    while True:
        try:
            await discover_once(fleet(), session, learned)
        except Exception:  # one bad round must not end discovery
            log.exception("adapter discovery round failed")
        await asyncio.sleep(interval_s)
