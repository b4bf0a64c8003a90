"""A request's token blocks, to match it against the replicas' KV-cache events.

Tokens come from a replica's own ``/tokenize`` (vLLM's; the simulated replica has it too): the
chat template, the tokenizer and the special tokens are then exactly the engine's, with no
model files in the gateway, and its CPU is the replica's API server's, not the event loop
every request shares. docs/decision-time.md measures the round trip against tokenizing in the
gateway. Any failure (a timeout, an error answer, a body /tokenize does not take) leaves the
request on the estimate: exactness is an optimisation, never a reason to fail a request.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson

from gateway.fleet.pools import PoolState
from gateway.http.request_body import Endpoint, ParsedRequest
from gateway.routing.resolve import Resolution
from router_policies.engine_blocks import root_key, token_block_keys
from router_policies.fingerprint import LEADING_ROLES, RequestFeatures

log = logging.getLogger(__name__)

_CHAT_FIELDS = (
    "messages", "tools", "add_generation_prompt", "continue_final_message",
    "add_special_tokens", "chat_template_kwargs", "documents",
)  # fmt: skip
"""What vLLM's chat /tokenize reads of a chat completion's body to render it alike."""


def tokenize_body(parsed: ParsedRequest, model: str) -> dict[str, Any] | None:
    """The /tokenize request for ``parsed``; None where /tokenize cannot render it alike (a
    batch of prompts, token ids, the Responses API)."""
    body = parsed.body
    if parsed.endpoint is Endpoint.CHAT:
        out = {name: body[name] for name in _CHAT_FIELDS if name in body}
    elif parsed.endpoint is Endpoint.COMPLETIONS and isinstance(body.get("prompt"), str):
        out = {"prompt": body["prompt"]}
    else:
        return None
    out["model"] = model
    return out


def believed_held(pool: PoolState, features: RequestFeatures, now: float) -> tuple[int, int]:
    """The block size of the pool's KV events (0 where no replica's events are read now) and
    the most bytes of the request the estimate believes one of those replicas holds; the scan
    stops at a replica believed to hold a useful part beyond the request's lead, as the
    request is then tokenized whole whatever the others hold."""
    if not pool.events_on:
        return 0, 0
    prefix = pool.policy.prefix
    enough = max(prefix.layout.end(prefix.min_match_blocks), features.lead_bytes + 1)
    block_size = deepest = 0
    for replica in pool.replicas.values():
        events = replica.exact_events(now)
        if events is not None and events.blocks.block_size:
            block_size = events.blocks.block_size
            deepest = max(deepest, pool.router.estimated_cached_bytes(replica.name, features))
            if deepest >= enough:
                break
    return block_size, deepest


def _most_held(pool: PoolState, keys: tuple[int, ...], now: float) -> int:
    """The most of ``keys``' first blocks one replica's events say it holds."""
    held = 0
    for replica in pool.replicas.values():
        events = replica.exact_events(now)
        if events is not None:
            held = max(held, events.blocks.match(keys))
    return held


LeadKey = tuple[str, int, int, int]
"""A shared lead's identity: pool (its tokenizer), chain root (adapter, salt), the digest of
the lead's fingerprint blocks and its length."""

_LEADS = 1024
"""Leads remembered: a fleet's system prompts and tool sets number far fewer, and one lead's
keys take a few KB."""


@dataclass(slots=True)
class _Lead:
    keys: tuple[int, ...]
    bytes_per_token: float
    prompt: int
    """The fingerprint of the prompt the keys came from."""
    confirmed: bool = False
    """Another prompt opening with the lead was seen (tokenized too, or held by a replica):
    ``keys`` are then the blocks the two share (at most a block past the lead's end), not the
    first prompt's all."""


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


class LeadKeys:
    """The token keys of shared leads (system prompts, tool sets), learned from the requests
    tokenized with them. While no replica is believed to hold more of a request than its lead,
    its events can only say how much of the lead each replica still holds, and the lead's own
    keys answer that without a /tokenize round trip: a shared system prompt costs one round
    trip where a replica already holds another prompt opening with it (two where none does),
    not one per request."""

    def __init__(self, capacity: int = _LEADS) -> None:
        self._leads: OrderedDict[LeadKey, _Lead] = OrderedDict()
        self._capacity = capacity

    def seen(self, key: LeadKey) -> bool:
        """Whether a prompt with this lead was tokenized before (confirmed or not)."""
        return key in self._leads

    def known(self, key: LeadKey) -> _Lead | None:
        lead = self._leads.get(key)
        if lead is None or not lead.confirmed:
            return None
        self._leads.move_to_end(key)
        return lead

    def learn(
        self,
        key: LeadKey,
        keys: tuple[int, ...],
        lead_blocks: int,
        request: RequestFeatures,
        held: int = 0,
    ) -> None:
        """``request``, opening with the lead, was tokenized into ``keys``; by its length the
        lead ends within its first ``lead_blocks`` blocks; ``held``: how many of those keys a
        replica's events hold of another prompt opening with the lead (0: none known)."""
        prompt = request.block_hashes[-1]
        lead = self._leads.get(key)
        if lead is None:
            per_token = request.hashed_bytes / max(request.prompt_tokens, 1)
            # The other prompt parts from this one where the lead ends, as a second tokenized
            # prompt would show, one round trip sooner. Less than half the lead held may be a
            # lead partly evicted: that waits for a second prompt.
            confirmed = held >= max(1, lead_blocks // 2)
            # Never more than a block past the lead: the rest is this prompt's own (a 100 KB
            # message's thousands of keys, held per lead up to _LEADS of them).
            kept = keys[: min(held, lead_blocks + 1) if confirmed else lead_blocks + 1]
            self._leads[key] = _Lead(kept, per_token, prompt, confirmed)
            if len(self._leads) > self._capacity:
                self._leads.popitem(last=False)
            return
        common = _common(lead.keys, keys)
        if not lead.confirmed:
            if prompt != lead.prompt:
                # Two prompts that also share what follows the lead stop a block past it.
                lead.keys, lead.confirmed = lead.keys[: min(common, lead_blocks + 1)], True
        elif common < len(lead.keys):
            lead.keys = lead.keys[:common]


def opening_turn(parsed: ParsedRequest) -> bool:
    """A chat whose lead is followed by one user message: no replica holds more of it than the
    lead, unless it was sent this very prompt before (which the estimate remembers)."""
    if parsed.endpoint is not Endpoint.CHAT:
        return False
    messages = parsed.body.get("messages")
    turns = [
        m for m in messages if isinstance(m, dict) and m.get("role") not in LEADING_ROLES
    ] if isinstance(messages, list) else []  # fmt: skip
    return len(turns) == 1 and turns[0].get("role") == "user"


class TokenKeys:
    """Adds the token keys to a request's features where its pool routes on KV events."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        self.leads = LeadKeys()

    async def of(self, resolution: Resolution, features: RequestFeatures) -> RequestFeatures:
        """``features`` with the token keys, for a pool that routes on KV events: the request
        read as its replicas read it (a tier model's with its pool's model)."""
        return await self.attach(resolution.pool, resolution.parsed, features)

    async def attach(
        self, pool: PoolState, parsed: ParsedRequest, features: RequestFeatures
    ) -> RequestFeatures:
        block_size, deepest = believed_held(pool, features, time.monotonic())
        prefix = pool.policy.prefix
        least = prefix.layout.end(prefix.min_match_blocks)
        if not block_size or deepest < least:
            # Held nowhere: its exact count could only say less (or tell what another instance
            # sent without shared state), and a prompt of its own text costs no round trip.
            return features
        model = parsed.model or pool.model
        # An adapter's blocks are its own (the engine seeds their chain with its name).
        lora = model if model != pool.model else None
        root = root_key(lora, parsed.cache_salt or None)
        lead_key: LeadKey | None = None
        opening = False
        if features.lead_bytes >= least:
            # The lead's own keys serve an opening turn that nobody is believed to hold past its
            # lead; a later turn is tokenized whole, as its history may be held where the
            # estimate has forgotten it.
            lead_key = (pool.name, root, features.home_key, features.lead_bytes)
            opening = deepest <= features.lead_bytes and opening_turn(parsed)
            lead = self.leads.known(lead_key) if opening else None
            if lead is not None:
                tokens = round(features.hashed_bytes / lead.bytes_per_token)
                held = len(lead.keys) * block_size
                return replace(features, token_keys=lead.keys, prompt_tokens=max(tokens, held + 1))
        tokenized = await self._tokenize(pool, parsed, model, block_size, root)
        if tokenized is None:
            return features
        keys, count = tokenized
        features = replace(features, token_keys=keys, prompt_tokens=count)
        if lead_key is not None and count:
            lead_blocks = features.lead_bytes * count // features.hashed_bytes // block_size
            # An opening nobody was sent (its lead not yet seen): what a replica holds of it is
            # another prompt's. A lead seen before learns from this prompt's keys alone.
            first = opening and not self.leads.seen(lead_key)
            held = _most_held(pool, keys, time.monotonic()) if first else 0
            self.leads.learn(lead_key, keys, lead_blocks, features, held)
        return features

    async def _tokenize(
        self, pool: PoolState, parsed: ParsedRequest, model: str, block_size: int, root: int
    ) -> tuple[tuple[int, ...], int] | None:
        """The prompt's token keys and token count, by a replica's /tokenize; None on any
        failure."""
        body = tokenize_body(parsed, model)
        # Not an ejected replica: it answers /health but may hang every request, and, sent
        # no traffic, it would always look the least busy.
        routable = pool.routable()
        if body is None or not routable:
            return None
        # The least busy replica: its API server tokenizes beside serving.
        replica = min(routable, key=lambda r: r.inflight + r.remote_inflight)
        timeout = aiohttp.ClientTimeout(total=pool.policy.prefix.events.tokenize_timeout_s)
        try:
            async with self._session.post(
                f"{replica.url}/tokenize", data=orjson.dumps(body), timeout=timeout,
                headers={"Content-Type": "application/json"},
            ) as resp:  # fmt: skip
                if resp.status != 200:
                    log.debug("/tokenize on %s answered %d", replica.name, resp.status)
                    return None
                tokens = orjson.loads(await resp.read())["tokens"]
            return token_block_keys(tokens, block_size, root), len(tokens)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            log.debug("/tokenize on %s failed: %r", replica.name, exc)
            return None
