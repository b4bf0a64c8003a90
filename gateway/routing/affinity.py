"""Where a request must, or should, go besides what the pool's policy decides.

- A `/v1/responses` request with `previous_response_id` must go to the replica that served that
  response: vLLM keeps stored responses in the server's own memory, and no other replica has it.
  The gateway learns each response's id from the relayed body or stream (bounded, LRU).
- A request naming a LoRA adapter must go to a replica that lists the adapter in its
  /v1/models, where any available one does (vLLM answers 404 for an adapter it does not serve,
  and a 4xx is never retried); among those it should go to one that served the adapter lately,
  else to its rendezvous home (router_policies/adapter_placement.py decides; this remembers who
  served which adapter).

The pool's policy still makes the choice, among the replicas left to it: `RouteHooks.exclude`
names the others to the Forwarder (on every attempt when pinned or required, on the first only
when merely preferred), and `RouteHooks.answered` watches the relayed bytes for what to
remember.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.fleet.replicas import ReplicaState
from router_policies.adapter_placement import AdapterSettings, preferred_replicas
from router_policies.tier_memory import continues, conversation_keys
from router_policies.tier_router import TierRouter

RESPONSE_HOMES = 100_000
"""Response ids remembered: ~100 bytes each, and vLLM's own store is bounded by its memory."""
_ADAPTERS_TRACKED = 10_000
_ID_SCAN_BYTES = 64 * 1024
"""How far into a response to look for its id: vLLM puts it in the first event or field."""
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"([^"]*)"')
"""The answer's first id, the response's (vLLM writes it first, in a stream's first event)."""
_STORABLE_ID = re.compile(rb"[A-Za-z0-9_.:@+=~-]{1,256}")
"""An id that reads back as a path segment: vLLM's own (``resp_`` and a uuid), or the
client's `request_id`, which vLLM answers as the response's id."""


@dataclass(frozen=True, slots=True)
class ReplicaRef:
    pool: str
    replica: str
    owner: str | None = None
    """The tenant whose request stored the response (None: a caller with no tenant, as every
    caller is without tenants): only that tenant may read it, cancel it or continue from it,
    and one with no owner only the callers with no tenant (a response stored before tenants
    were added included: it is no tenant's to read)."""

    def readable_by(self, tenant: str | None) -> bool:
        return self.owner == tenant


Publish = Callable[[str, ReplicaRef], None]
Fetch = Callable[[str], Awaitable[ReplicaRef | None]]


class HomesUnavailable(Exception):
    """The shared state that knows where other processes' responses are stored could not be
    asked (away, or failing): the home is unknown, not absent."""


class ResponseHomes:
    """Response id -> the replica that stored it; least recently used forgotten first.

    Any process of the gateway may be asked for a response another one relayed (the kernel
    spreads connections over `--workers`, a load balancer over instances), so the shared-state
    backend, when there is one, sets ``publish`` (told each home learned here) and ``fetch``
    (asked for an id not known here)."""

    def __init__(self, capacity: int = RESPONSE_HOMES) -> None:
        self.capacity = capacity
        self._homes: OrderedDict[str, ReplicaRef] = OrderedDict()
        self.publish: Publish | None = None
        self.fetch: Fetch | None = None

    def __len__(self) -> int:
        return len(self._homes)

    def remember(self, response_id: str, home: ReplicaRef) -> None:
        """A home learned from a relayed answer: kept, and shared, unless ``learn`` refuses it."""
        if self.learn(response_id, home) and self.publish is not None:
            self.publish(response_id, home)

    def learn(self, response_id: str, home: ReplicaRef) -> bool:
        """A home kept here only (learned here, or from another process); False, and nothing
        kept, for an id known under another owner. vLLM lets a client choose a response's id
        (`request_id`): an answer carrying another tenant's id must not hand that tenant's
        stored response over, so an id never changes owner."""
        known = self._homes.get(response_id)
        if known is not None and known.owner != home.owner:
            return False
        self._keep(response_id, home)
        return True

    def _keep(self, response_id: str, home: ReplicaRef) -> None:
        self._homes[response_id] = home
        self._homes.move_to_end(response_id)
        while len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def overrule(self, response_id: str, home: ReplicaRef | None) -> None:
        """The shared state knew the id first, under another owner: its home replaces the one
        learned here (None: one this version cannot read, so the id is forgotten here and
        found nowhere, rather than left to the owner learned here)."""
        if home is None:
            self._homes.pop(response_id, None)
        else:
            self._keep(response_id, home)

    def get(self, response_id: str) -> ReplicaRef | None:
        home = self._homes.get(response_id)
        if home is not None:
            self._homes.move_to_end(response_id)
        return home

    async def find(self, response_id: str) -> ReplicaRef | None:
        """The home, asking the shared state when this process does not know it (None: no
        process stored it); HomesUnavailable when the shared state cannot be asked."""
        home = self.get(response_id)
        if home is None and self.fetch is not None:
            home = await self.fetch(response_id)
            if home is not None:
                self.learn(response_id, home)
        return home


class AdapterHomes:
    """(pool, adapter) -> the replicas that served it, with when they last did."""

    def __init__(self) -> None:
        self._served: OrderedDict[tuple[str, str], dict[str, float]] = OrderedDict()

    def served(self, pool: str, adapter: str, replica: str, now: float) -> None:
        key = (pool, adapter)
        self._served.setdefault(key, {})[replica] = now
        self._served.move_to_end(key)
        while len(self._served) > _ADAPTERS_TRACKED:
            self._served.popitem(last=False)

    def warm(self, pool: str, adapter: str, now: float, warm_s: float) -> frozenset[str]:
        """The replicas that served it within ``warm_s``."""
        served = self._served.get((pool, adapter), {})
        return frozenset(name for name, at in served.items() if now - at <= warm_s)


class LargeConversations:
    """The conversations a tier model sent large, between processes. Each tier model remembers
    its own (router_policies/tier_memory.py); the shared-state backend, when there is one, sets
    ``publish`` (told each conversation sent large here) and ``fetch`` (asked, before a
    follow-up turn is scored, whether another process sent its conversation large)."""

    def __init__(self) -> None:
        self.publish: Callable[[str, int], None] | None = None
        self.fetch: Callable[[str, tuple[int, ...]], Awaitable[bool]] | None = None
        """Whether another process sent the conversation large under any of its keys."""

    async def recall(self, tiers: TierRouter | None, body: Mapping[str, Any]) -> None:
        """Before scoring (a dry run's too, or it would disagree with the real decision): a
        follow-up of a conversation another process sent large is remembered here too, as
        the fact it is, not as traffic. Nothing to ask for a first turn (a classification
        consults no memory for it), or without a tier model or a backend."""
        if tiers is None or self.fetch is None or not tiers.settings.conversation_memory:
            return
        keys = conversation_keys(body)
        if (
            continues(keys)
            and not tiers.conversations.any_went_large(keys)
            and await self.fetch(tiers.model, keys)
        ):
            tiers.remember(keys[-1])

    def tell(self, tiers: TierRouter, conversation: int) -> None:
        if self.publish is not None:
            self.publish(tiers.model, conversation)


@dataclass(slots=True)
class RoutingMemory:
    """What the gateway remembers across requests and policy reloads, for the hooks above."""

    responses: ResponseHomes = field(default_factory=ResponseHomes)
    adapters: AdapterHomes = field(default_factory=AdapterHomes)
    large_conversations: LargeConversations = field(default_factory=LargeConversations)
    learned_adapters: dict[str, frozenset[str]] = field(default_factory=dict)
    """Pool name -> adapters its replicas list that the policy does not declare
    (gateway/fleet/adapter_discovery.py; which replica lists which: `ReplicaState.adapters`)."""


def adapter_replicas(
    homes: AdapterHomes,
    pool: str,
    adapter: str,
    replicas: Iterable[ReplicaState],
    settings: AdapterSettings,
    now: float | None = None,
) -> frozenset[str]:
    """The replicas an adapter's request should try first (router_policies/adapter_placement.py
    decides), from the replicas available now and those that served it lately."""
    now = time.monotonic() if now is None else now
    inflight = {r.name: r.inflight for r in replicas if r.available(now)}
    warm = homes.warm(pool, adapter, now, settings.warm_s)
    return preferred_replicas(adapter, inflight, warm, settings)


@dataclass(slots=True)
class RouteHooks:
    """A request's placement constraints and what to learn from its answer (see module doc)."""

    memory: RoutingMemory
    pool: str
    replicas: frozenset[str] = frozenset()
    """The pool's replicas this request may use; empty: all of them."""
    pinned: bool = False
    """Hold `replicas` on every attempt (a stored response), not only the first."""
    adapter: str | None = None
    learn_response_id: bool = False
    owner: str | None = None
    """The tenant a response learned from this answer belongs to."""
    required: frozenset[str] = frozenset()
    """The replicas every attempt must stay among (those listing the adapter); empty: any. A
    first attempt's `replicas` lie within them."""
    _head: bytes = b""

    def exclude(self, every: Iterable[str], tried: list[str], attempt: int) -> list[str]:
        """The replicas the Forwarder must not try on this attempt."""
        keep = self.replicas if attempt == 0 or self.pinned else frozenset()
        keep = keep or self.required
        if not keep:
            return tried
        return [*tried, *(name for name in every if name not in keep)]

    def answered(self, replica: str, status: int, data: bytes) -> bool:
        """Sees the relayed bytes (the whole body, or stream chunks in order); True while it
        wants the next chunk."""
        if status >= 400:
            return False
        if self.adapter is not None:
            self.memory.adapters.served(self.pool, self.adapter, replica, time.monotonic())
            self.adapter = None  # once per request
        if not self.learn_response_id:
            return False
        self._head += data
        found = _RESPONSE_ID.search(self._head)
        if found is not None and _STORABLE_ID.fullmatch(found.group(1)):
            home = ReplicaRef(self.pool, replica, self.owner)
            self.memory.responses.remember(found.group(1).decode(), home)
        if found is not None or len(self._head) > _ID_SCAN_BYTES:
            self.learn_response_id = False
            self._head = b""
            return False
        return True
