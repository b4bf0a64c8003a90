"""Prefix-aware routing by predicted time to first token.

For every healthy replica the cost model predicts this request's TTFT there: the prefill work
queued ahead of it, plus the prefill of the part of its prompt that replica does not hold
(from this policy's index of what it sent where), plus one engine step beside the running
batch. Pinning falls out of the model: a cache hit is cheap and a cold prefill expensive, so a
burst of hits stays home, while a queue on the home sends the next request to a warm second
replica. Then:

- Replicas within ``cost.near_s`` of the fastest are equally good; among them the balance rule
  picks: the first in the prefix's rendezvous order whose recent dispatches are under the
  bounded-load cap (so every gateway instance agrees where a new prefix lives), or, for a
  prompt that is mostly its own unique text (Preble's rule), the least recently loaded.
- A hot prefix, whose recent share of the pool's traffic is more than a fair share of one
  replica, counts as warm on the first k replicas of its rendezvous order (k follows its share),
  so it spreads over k warm replicas instead of overloading one.
"""

from __future__ import annotations

from typing import ClassVar

from router_policies.cost.copies import copy_penalty_s
from router_policies.cost.objective import late_choice
from router_policies.cost.rates import Rates
from router_policies.cost.ttft import estimate, predicted_s
from router_policies.decision import Candidate, CandidateCost, Decision, PoolSnapshot, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.hot_prefixes import HotPrefixes, spread
from router_policies.load import recent_cap
from router_policies.policies.base import Need, SelectionPolicy
from router_policies.prefix_index import PrefixIndex
from router_policies.rendezvous import hrw_score
from router_policies.schema import PoolPolicy, PrefixSettings

_Scored = tuple[float, Candidate, int, float]
"""(predicted TTFT, candidate, matched bytes, tokens it is expected to prefill)."""


def default_rates(policy: PoolPolicy) -> Rates:
    cost = policy.cost
    return Rates(1.0 / cost.prefill_tokens_per_s, cost.step_s, cost.decode_s_per_seq)


def _useful(matched_bytes: int, request: RequestFeatures, prefix: PrefixSettings) -> bool:
    if matched_bytes < prefix.layout.end(prefix.min_match_blocks):
        return False
    return matched_bytes >= prefix.min_match_ratio * request.hashed_bytes


class PrefixAware(SelectionPolicy):
    needs: ClassVar[frozenset[Need]] = frozenset({Need.LOAD, Need.RATES})

    def __init__(self, policy: PoolPolicy, previous: PrefixAware | None = None) -> None:
        self.policy = policy
        self.prefix: PrefixSettings = policy.prefix
        self.layout = policy.prefix.layout
        self._default_rates = default_rates(policy)
        keep = previous is not None and previous.policy.prefix == policy.prefix
        # Digests of another block size or seed match nothing: an index survives a reload only
        # when the fingerprint settings are unchanged.
        self._indexes: dict[str, PrefixIndex] = dict(previous._indexes) if keep and previous else {}
        same_hot = previous is not None and previous.policy.hot == policy.hot
        self.hot: HotPrefixes = (
            previous.hot if same_hot and previous else HotPrefixes(policy.hot.half_life_s)
        )

    def _index(self, replica: str) -> PrefixIndex:
        index = self._indexes.get(replica)
        if index is None:
            index = self._indexes[replica] = PrefixIndex(self.prefix.index_blocks, self.layout)
        return index

    def matched_blocks(self, replica: str, request: RequestFeatures) -> int:
        index = self._indexes.get(replica)
        return index.match_length(request.block_hashes) if index is not None else 0

    def record(self, request: RequestFeatures, decision: Decision, now: float) -> None:
        self._index(decision.replica).insert(request.block_hashes)
        self.hot.record(request.home_key, now)

    def size_index(self, replica: str, blocks: int) -> None:
        self._index(replica).resize(blocks)

    def index_blocks(self, replica: str) -> int:
        return self._index(replica).capacity

    def select(
        self, request: RequestFeatures, snapshot: PoolSnapshot, *, explain: bool = False
    ) -> Decision | None:
        candidates = snapshot.candidates
        if not candidates:
            return None
        prefix = self.prefix
        layout = self.layout
        key = request.home_key
        lead_bytes = layout.floor(request.lead_bytes)
        has_home = _useful(lead_bytes, request, prefix)
        total = request.hashed_bytes
        matched = [min(layout.end(self.matched_blocks(c.name, request)), total) for c in candidates]
        spread_homes = self._spread_homes(request, snapshot, matched) if has_home else frozenset()

        per_token_bytes = snapshot.chars_per_token
        prompt_tokens = total / per_token_bytes
        default = self._default_rates
        scored = []
        for c, matched_bytes in zip(candidates, matched, strict=True):
            warm_bytes = max(matched_bytes, lead_bytes) if c.name in spread_homes else matched_bytes
            expected = (total - warm_bytes) / per_token_bytes
            scored.append(
                (
                    predicted_s(c.load, expected, prompt_tokens, c.rates or default),
                    c,
                    matched_bytes,
                    expected,
                )
            )

        cost = self.policy.cost
        predictions = [item[0] for item in scored]
        late = late_choice(
            predictions,
            [p - e * (c.rates or default).prefill_s_per_token for p, c, _, e in scored],
            cost.ttft_objective_s,
            cost.late_limit_s,
        )
        warmest = min(item[3] for item in scored)
        ranked = [
            (
                p
                + copy_penalty_s(
                    e, warmest, (c.rates or default).prefill_s_per_token, cost.copy_weight
                ),
                c,
                m,
                e,
            )
            for p, c, m, e in scored
        ]
        fastest = min(item[0] for item in ranked)
        limit = fastest * (1 + cost.near_ratio) + cost.near_s
        if cost.ttft_objective_s is not None and fastest <= cost.ttft_objective_s:
            limit = min(limit, cost.ttft_objective_s)
        # "not >" rather than "<=": were a prediction ever NaN, every replica stays a choice.
        near = [item for item in ranked if not item[0] > limit]
        useful = {c.name for _, c, matched, _ in near if _useful(matched, request, prefix)}
        if late is not None:
            _, chosen, matched_bytes, expected = scored[late]
        else:
            _, chosen, matched_bytes, expected = self._balance(
                near, candidates, key, useful | spread_homes, has_home
            )
        if late is not None:
            route = Route.LATE
        elif chosen.name in useful:
            route = Route.PREFIX_HIT
        elif has_home:
            route = Route.PREFIX_HOME
        else:
            route = Route.LEAST_LOADED
        costs: tuple[CandidateCost, ...] = ()
        if explain:
            costs = tuple(
                CandidateCost(
                    c.name,
                    self.matched_blocks(c.name, request),
                    (total - m) / per_token_bytes,
                    estimate(c.load, e, prompt_tokens, c.rates or default),
                    c.recent,
                    c.rates or default,
                )
                for _, c, m, e in scored
            )
        return Decision(
            chosen.name,
            route,
            self.matched_blocks(chosen.name, request),
            (total - matched_bytes) / per_token_bytes,
            estimate(chosen.load, expected, prompt_tokens, chosen.rates or default),
            costs,
        )

    def _spread_homes(
        self, request: RequestFeatures, snapshot: PoolSnapshot, matched: list[int]
    ) -> frozenset[str]:
        """The replicas a hot prefix counts as warm on, sent there yet or not: those that hold
        its lead, plus, while they are fewer than k, the least recently loaded others, and the
        pool's least loaded replica whenever every holder is busier than it by more than the
        balance factor: the hot prefix's traffic is the fluid that fills the pool's valleys,
        which the sticky single-home prefixes cannot do. A cold prefix (k = 1) needs no such
        credit: its one home is where a cold start goes anyway."""
        candidates = snapshot.candidates
        share = self.hot.share(request.home_key, snapshot.now, self.policy.hot.min_requests)
        k = spread(share, len(candidates), self.policy.hot.spread_factor)
        if k <= 1:
            return frozenset()
        lead = self.layout.floor(request.lead_bytes)
        holding = [c for c, m in zip(candidates, matched, strict=True) if m >= lead]
        holders = frozenset(c.name for c in holding)
        key = request.home_key
        others = sorted(
            (c for c in candidates if c.name not in holders),
            key=lambda c: (c.recent, -hrw_score(key, c.name)),
        )
        missing = k - len(holding)
        if missing <= 0 and others:
            valley = others[0].recent * (1 + self.policy.load.balance_eps) + 1
            missing = int(min(c.recent for c in holding) > valley)
        return holders | {c.name for c in others[:missing]}

    def _balance(
        self,
        near: list[_Scored],
        candidates: tuple[Candidate, ...],
        key: int,
        useful: set[str],
        has_home: bool,
    ) -> _Scored:
        if has_home:
            # Among equally fast replicas, those warm for the prompt (holding it, or a spread
            # home of a hot prefix): a cold copy elsewhere costs a prefill and cache room, so
            # the balance rule only moves a prompt between warm replicas, or places a new one.
            # Several warm replicas share the prompt's traffic evenly: the least recently loaded.
            warm = [item for item in near if item[1].name in useful]
            if warm:
                near = warm
            else:
                # A new home: the prefix's own rendezvous order, skipping replicas over the
                # bounded-load cap, so every gateway instance places it alike while the pool
                # is balanced.
                cap = recent_cap([c.recent for c in candidates], self.policy.load.balance_eps)
                by_rank = sorted(near, key=lambda item: hrw_score(key, item[1].name), reverse=True)
                under = next((item for item in by_rank if item[1].recent + 1 <= cap), None)
                if under is not None:
                    return under
        return min(near, key=lambda item: (item[1].recent, -hrw_score(key, item[1].name)))
