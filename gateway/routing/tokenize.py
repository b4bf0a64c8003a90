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
from dataclasses import replace
from typing import Any

import aiohttp
import orjson

from gateway.fleet.pools import PoolState
from gateway.http.request_body import Endpoint, ParsedRequest
from router_policies.engine_blocks import root_key, token_block_keys
from router_policies.fingerprint import RequestFeatures

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


def worth_tokenizing(pool: PoolState, features: RequestFeatures, now: float) -> int:
    """Block size of the pool's KV events where the request's tokens are worth asking for (0
    otherwise): some replica whose events routing reads is believed to hold a block of it.
    Where none is, its exact count could only say less (or tell what another instance sent
    without shared state), and a prompt of its own text costs no round trip."""
    if not pool.events_on:
        return 0
    prefix = pool.policy.prefix
    least = prefix.layout.end(prefix.min_match_blocks)
    for replica in pool.replicas.values():
        events = replica.exact_events(now)
        if events is not None and events.blocks.block_size:
            if pool.router.estimated_cached_bytes(replica.name, features) >= least:
                return events.blocks.block_size
    return 0


class TokenKeys:
    """Adds the token keys to a request's features where its pool routes on KV events."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    async def attach(
        self, pool: PoolState, parsed: ParsedRequest, features: RequestFeatures
    ) -> RequestFeatures:
        block_size = worth_tokenizing(pool, features, time.monotonic())
        if not block_size:
            return features
        model = parsed.model or pool.model
        body = tokenize_body(parsed, model)
        healthy = pool.healthy()
        if body is None or not healthy:
            return features
        # The least busy replica: its API server tokenizes beside serving.
        replica = min(healthy, key=lambda r: r.inflight + r.remote_inflight)
        timeout = aiohttp.ClientTimeout(total=pool.policy.prefix.events.tokenize_timeout_s)
        try:
            async with self._session.post(
                f"{replica.url}/tokenize", data=orjson.dumps(body), timeout=timeout,
                headers={"Content-Type": "application/json"},
            ) as resp:  # fmt: skip
                if resp.status != 200:
                    log.debug("/tokenize on %s answered %d", replica.name, resp.status)
                    return features
                tokens = orjson.loads(await resp.read())["tokens"]
            # An adapter's blocks are its own (the engine seeds their chain with its name).
            lora = model if model != pool.model else None
            keys = token_block_keys(tokens, block_size, root_key(lora, parsed.cache_salt or None))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            log.debug("/tokenize on %s failed: %r", replica.name, exc)
            return features
        return replace(features, token_keys=keys, prompt_tokens=len(tokens))
