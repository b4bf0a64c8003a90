"""Where a request naming a LoRA adapter should go first: a replica that served the adapter
lately (vLLM loads adapters on demand, so a cold replica pays a load and a slot of
--max-loras first), else the adapter's rendezvous home, on which every gateway instance
agrees; no preference when those are much busier than the pool, where loading the adapter
elsewhere costs less than waiting for them. The pool's policy still chooses among the replicas
this leaves it (gateway/routing/affinity.py applies it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import xxhash
from pydantic import Field

from router_policies.rendezvous import hrw_score
from router_policies.strict_model import StrictModel


class AdapterSettings(StrictModel):
    """Policy-file section ``adapter_placement`` of a pool."""

    warm_s: Annotated[float, Field(gt=0)] = 300.0
    """A replica that served an adapter this recently counts as having it loaded: vLLM keeps a
    loaded adapter until --max-loras others push it out, minutes at a typical adapter mix."""
    balance_ratio: Annotated[float, Field(ge=0.0, le=10.0)] = 0.25
    """Warm replicas are preferred while their least busy one has at most (1 + this) x the
    pool's least in-flight count (+ ``slack``) requests in flight: the same tolerance as the
    hot-prefix rule's `load.balance_eps`, but an adapter's own setting."""
    slack: Annotated[float, Field(ge=0.0)] = 1.0
    """Requests in flight beyond that ratio still tolerated: on an idle pool one request more
    on the warm replica is cheaper than an adapter load."""


def adapter_key(adapter: str) -> int:
    return xxhash.xxh3_64_intdigest(f"lora\x00{adapter}".encode())


def preferred_replicas(
    adapter: str,
    inflight: Mapping[str, int],
    warm: frozenset[str],
    settings: AdapterSettings,
) -> frozenset[str]:
    """Among the available replicas (name -> requests in flight), those the adapter's request
    should try first; empty: no preference."""
    if not inflight:
        return frozenset()
    chosen = [name for name in inflight if name in warm]
    if not chosen:
        key = adapter_key(adapter)
        chosen = [max(inflight, key=lambda name: hrw_score(key, name))]
    least = min(inflight.values())
    if (
        min(inflight[name] for name in chosen)
        > (1 + settings.balance_ratio) * least + settings.slack
    ):
        return frozenset()
    return frozenset(chosen)
