"""Prefix-aware routing by predicted time to first token.

For every healthy replica the cost model predicts this request's TTFT there: the prefill work
queued ahead of it, plus the prefill of the part of its prompt that replica does not hold
(from this policy's index of what it sent where), plus one engine step beside the running
batch. Pinning falls out of the model: a cache hit is cheap and a cold prefill expensive, so a
burst of hits stays home, while a queue on the home sends the next request to a warm second
replica. Then:

- A replica's score adds the copy charge (cost/copies.py): a cold copy costs the fleet more
  than this request's wait. Replicas scored within ``cost.near_ratio`` x the best +
  ``cost.near_s`` are equally good; among them a warm one is kept if there is one, and the
  least recently loaded is chosen, ties by rendezvous order. A prompt no replica holds a
  useful part of, and without a shared lead worth a home (Preble's rule), goes to the one whose
  cache has taken the least new text (turnover below); a shorter lead counts as held on every
  replica, so it neither charges a copy nor draws such prompts to its holder. A new prefix, or
  a copy of one, goes where recent requests and shared prefixes held, each against the pool's
  mean, sum least.
- A hot prefix, whose recent share of the pool's traffic is more than a fair share of one
  replica, counts as warm on k replicas (k follows its share), so it spreads over k warm
  replicas instead of overloading one.
- With a TTFT objective set (the pool's, or the request's own), a request predicted to miss
  it everywhere joins the replica furthest behind (cost/objective.py).
- A request naming a session goes back to the replica the session last went to, unless a cold
  start of its whole prompt elsewhere is predicted sooner, or the key takes more than a
  replica's fair share of the traffic (router_policies/sessions.py).

Turnover is the cache room a replica's prompts newly took (in index units, since the policy
began): what its engine stored, evicting as much of older histories. Balanced by request
counts, a replica that drew a few long prompts evicts its conversations' histories before
their next turns while another keeps its own; balanced by turnover, every replica evicts at
the pool's pace and histories last about as long everywhere, as in one cache the fleet's size.
The count does not fade, as the peers' "smallest tree" does not: a replica that took a burst of
long prompts keeps its debt until the others have taken as much (against a 10 s half-life,
0.5 points more of the bound on average over the four Mooncake tuning windows, loaded and at
zero load; docs/benchmarks.md). A replica further behind than its own index's capacity (one
added to the pool, or back from an outage) counts as that far behind once it takes a prompt:
its free room takes new prompts until it is full, not the pool's past.

The index remembers ``prefix.index_memory`` caches' worth of what each replica was sent (1.25
by default: a little longer than the engine holds it); see the setting for why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from router_policies.cost.copies import copy_penalty_s
from router_policies.cost.objective import late_choice
from router_policies.cost.rates import Rates, default_rates
from router_policies.cost.ttft import TtftEstimate, estimate, predicted_s
from router_policies.decision import Candidate, CandidateCost, Decision, PoolSnapshot, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.hot_prefixes import HotPrefixes, spread
from router_policies.policies.base import Need, SelectionPolicy
from router_policies.prefix_index import PrefixIndex, Recorded
from router_policies.prefix_settings import PrefixSettings
from router_policies.rendezvous import hrw_score
from router_policies.schema import PoolPolicy
from router_policies.sessions import Sessions


def _useful(matched_bytes: int, request: RequestFeatures, prefix: PrefixSettings) -> bool:
    if matched_bytes < prefix.layout.end(prefix.min_match_blocks):
        return False
    return matched_bytes >= prefix.min_match_ratio * request.hashed_bytes


@dataclass(slots=True)
class _Figures:
    """One request's figures for each candidate (by index), as select weighs them."""

    has_home: bool
    """The request's shared lead is long enough to be worth a home."""
    total: int
    """The prompt's hashed bytes."""
    per_token_bytes: float
    blocks: list[int]
    """Blocks matched on each candidate (the index's, or the events' for a tokenized request)."""
    matched: list[int]
    """Bytes of the prompt each candidate holds."""
    spread_homes: set[int]
    """Candidates a hot prefix counts as warm on."""
    rates: list[Rates]
    expected: list[float]
    """Prompt tokens each candidate would prefill."""
    predicted: list[float]
    """Predicted TTFT on each candidate, seconds."""

    @property
    def prompt_tokens(self) -> float:
        return self.total / self.per_token_bytes

    def uncached(self, i: int) -> float:
        return (self.total - self.matched[i]) / self.per_token_bytes

    def estimate(self, candidate: Candidate, i: int) -> TtftEstimate:
        return estimate(candidate.load, self.expected[i], self.prompt_tokens, self.rates[i])

    def behind(self) -> list[float]:
        """Each candidate's predicted wait before this request's own prefill."""
        return [
            p - e * r.prefill_s_per_token
            for p, e, r in zip(self.predicted, self.expected, self.rates, strict=True)
        ]


class PrefixAware(SelectionPolicy):
    needs: ClassVar[frozenset[Need]] = frozenset({Need.LOAD, Need.RATES})

    def __init__(self, policy: PoolPolicy, previous: PrefixAware | None = None) -> None:
        self.policy = policy
        self.prefix: PrefixSettings = policy.prefix
        self.layout = policy.prefix.layout
        self._default_rates = default_rates(policy.cost)
        keep = previous is not None and previous.policy.prefix.same_digests(policy.prefix)
        self._indexes: dict[str, PrefixIndex] = dict(previous._indexes) if keep and previous else {}
        self._turnover: dict[str, float] = dict(previous._turnover) if keep and previous else {}
        same_hot = previous is not None and previous.policy.hot == policy.hot
        self.hot: HotPrefixes = (
            previous.hot if same_hot and previous else HotPrefixes(policy.hot.half_life_s)
        )
        self.sessions: Sessions = (
            previous.sessions if previous is not None else Sessions(policy.hot.half_life_s)
        )

    def _index(self, replica: str) -> PrefixIndex:
        index = self._indexes.get(replica)
        if index is None:
            index = PrefixIndex(self._remembered(self.prefix.index_blocks), self.layout)
            self._indexes[replica] = index
        return index

    def _remembered(self, engine_blocks: int) -> int:
        """The index's capacity for an engine cache of ``engine_blocks``."""
        return int(engine_blocks * self.prefix.index_memory)

    def matched_blocks(self, replica: str, request: RequestFeatures) -> int:
        index = self._indexes.get(replica)
        return index.match_length(request.block_hashes) if index is not None else 0

    def estimated_cached_bytes(self, replica: str, request: RequestFeatures) -> int:
        return min(self.layout.end(self.matched_blocks(replica, request)), request.hashed_bytes)

    def record(self, request: RequestFeatures, decision: Decision, now: float) -> Recorded | None:
        if not request.block_hashes:  # /tokenize, a pooling request: no prompt the cache reads
            return None
        index = self._index(decision.replica)
        recorded = Recorded(index.match_length(request.block_hashes))
        added = index.insert(request.block_hashes, recorded.evicted)
        recorded.version = index.version
        turnover = self._turnover
        floor = max(turnover.values(), default=0.0) - index.capacity / self.prefix.index_memory
        turnover[decision.replica] = max(turnover.get(decision.replica, 0.0), floor) + added
        lead = self.layout.floor(request.lead_bytes)
        if _useful(lead, request, self.prefix):
            index.note_lead(request.home_key, lead)
        self.hot.record(request.home_key, now)
        capacity = self.policy.session.max_sessions
        if capacity:
            self.sessions.count(request.session, now)
        if request.session and capacity:
            self.sessions.bind(request.session, decision.replica, capacity)
        return recorded

    def refused(self, replica: str, request: RequestFeatures, recorded: Recorded) -> None:
        index = self._indexes.get(replica)
        if index is not None:
            taken = index.take_back(request.block_hashes, recorded)
            if taken:
                self._turnover[replica] = max(self._turnover[replica] - taken, 0.0)

    def forget(self, replica: str) -> None:
        self._indexes.pop(replica, None)
        self._turnover.pop(replica, None)

    def index_lead_bytes(self, replica: str) -> int:
        return self._index(replica).lead_bytes

    def size_index(self, replica: str, blocks: int) -> None:
        self._index(replica).resize(self._remembered(blocks))

    def index_blocks(self, replica: str) -> int:
        return self._index(replica).capacity

    def select(
        self, request: RequestFeatures, snapshot: PoolSnapshot, *, explain: bool = False
    ) -> Decision | None:
        candidates = snapshot.candidates
        if not candidates:
            return None
        f = self._figures(request, snapshot)
        objective = request.ttft_objective_s or self.policy.cost.ttft_objective_s
        chosen: int | None = None
        at_least = self.policy.hot.min_requests
        if request.session and not self.sessions.shared(
            request.session, snapshot.now, at_least, len(candidates)
        ):
            chosen = self._session_home(request.session, candidates, f)
            route = Route.SESSION
        if chosen is None and objective is not None:
            chosen = late_choice(f.predicted, f.behind(), objective, self.policy.cost.late_limit_s)
            route = Route.LATE
        if chosen is None:
            chosen, route = self._choose(request, snapshot, f, objective)
        costs: tuple[CandidateCost, ...] = ()
        if explain:
            costs = tuple(
                CandidateCost(c.name, f.blocks[i], f.uncached(i), f.estimate(c, i), c.recent, r)
                for i, (c, r) in enumerate(zip(candidates, f.rates, strict=True))
            )
        winner = candidates[chosen]
        return Decision(
            winner.name,
            route,
            f.blocks[chosen],
            f.uncached(chosen),
            f.estimate(winner, chosen),
            costs,
        )

    def _figures(self, request: RequestFeatures, snapshot: PoolSnapshot) -> _Figures:
        candidates = snapshot.candidates
        lead_bytes = self.layout.floor(request.lead_bytes)
        has_home = _useful(lead_bytes, request, self.prefix)
        total = request.hashed_bytes
        blocks = [self.matched_blocks(c.name, request) for c in candidates]
        matched = [min(self.layout.end(b), total) for b in blocks]
        if request.token_keys:  # only a tokenized request carries the events' figures
            for i, c in enumerate(candidates):
                if c.held_bytes is not None:
                    matched[i] = min(c.held_bytes, total)
                    blocks[i] = self.layout.blocks_within(matched[i])
        spread_homes = self._spread_homes(request, snapshot, matched) if has_home else set()
        # A shared lead too short to be a home counts as held everywhere (0 for a prompt with
        # no lead, which is matched as before). Preble's rule sends such a prompt by load, but
        # charged as a copy (copy_weight x its prefill) and credited only where it was sent,
        # the lead kept every other replica out of the near band: all of an app's new
        # conversations piled onto the one replica holding its system prompt. It is under half
        # the prompt, worth one cheap copy per replica, and after that copy it is held there.
        # A later turn's history beyond the lead is still charged, so it stays home. The
        # hot-prefix spread would lift the pile only once the lead's share of the pool's recent
        # requests passes a fair share, after tens of requests on one replica.
        credit = 0 if has_home else lead_bytes
        per_token_bytes = snapshot.chars_per_token
        prompt_tokens = total / per_token_bytes
        rates = [c.rates or self._default_rates for c in candidates]
        expected = [
            (total - max(m, lead_bytes if i in spread_homes else credit)) / per_token_bytes
            for i, m in enumerate(matched)
        ]
        predicted = [
            predicted_s(c.load, e, prompt_tokens, r)
            for c, e, r in zip(candidates, expected, rates, strict=True)
        ]
        return _Figures(
            has_home,
            total,
            per_token_bytes,
            blocks,
            matched,
            spread_homes,
            rates,
            expected,
            predicted,
        )

    def _choose(
        self, request: RequestFeatures, snapshot: PoolSnapshot, f: _Figures, objective: float | None
    ) -> tuple[int, Route]:
        """The ordinary choice, neither a session's home nor late: the replicas scored within
        the near band of the fastest, the copy charge added, are equally good; among them a
        warm one if any, else a home for a shared lead, else the least turned-over."""
        candidates = snapshot.candidates
        cost = self.policy.cost
        warmest = min(f.expected)
        score = [
            p + copy_penalty_s(e, warmest, r.prefill_s_per_token, cost.copy_weight)
            for p, e, r in zip(f.predicted, f.expected, f.rates, strict=True)
        ]
        fastest = min(score)
        limit = fastest * (1 + cost.near_ratio) + cost.near_s
        if objective is not None and fastest <= objective:
            limit = min(limit, objective)
        # "not >" rather than "<=": were a prediction ever NaN, every replica stays a choice.
        near = [i for i, s in enumerate(score) if not s > limit]
        useful = {i for i in near if _useful(f.matched[i], request, self.prefix)}
        warm = [i for i in near if i in useful or i in f.spread_homes]
        if warm:
            chosen = _least_loaded(warm, candidates, request.home_key)
        elif f.has_home:
            chosen = self._place(near, candidates, request.home_key)
        else:
            chosen = self._least_turnover(near, candidates, request.home_key)
        if chosen in useful:
            return chosen, Route.PREFIX_HIT
        return chosen, Route.PREFIX_HOME if f.has_home else Route.LEAST_LOADED

    def _session_home(
        self, session: str, candidates: tuple[Candidate, ...], f: _Figures
    ) -> int | None:
        """The candidate the session last went to, unless a cold start of the whole prompt
        on another replica is predicted sooner, beyond the near band (within it, replicas are
        equally fast: learned rates differ by noise); then the session moves with it."""
        home = self.sessions.home(session)
        at = next((i for i, c in enumerate(candidates) if c.name == home), None)
        if at is None:
            return None
        prompt_tokens = f.prompt_tokens
        cold = [
            predicted_s(c.load, prompt_tokens, prompt_tokens, r)
            for i, (c, r) in enumerate(zip(candidates, f.rates, strict=True))
            if i != at
        ]
        if not cold:
            return at
        cost = self.policy.cost
        return at if f.predicted[at] <= min(cold) * (1 + cost.near_ratio) + cost.near_s else None

    def _spread_homes(
        self, request: RequestFeatures, snapshot: PoolSnapshot, matched: list[int]
    ) -> set[int]:
        """The replicas (by index) a hot prefix counts as warm on, sent there yet or not: those
        that hold its lead, plus, while they are fewer than k, the least recently loaded others,
        and the pool's least loaded replica whenever every holder is busier than the typical
        (median) other replica by more than the balance factor: the hot prefix's traffic is
        the fluid that fills the pool's valleys, which the sticky single-home prefixes cannot
        do. A cold prefix (k = 1) needs no such credit: its one home is where a cold start
        goes anyway."""
        candidates = snapshot.candidates
        share = self.hot.share(request.home_key, snapshot.now, self.policy.hot.min_requests)
        k = spread(share, len(candidates), self.policy.hot.spread_factor)
        if k <= 1:
            return set()
        lead = self.layout.floor(request.lead_bytes)
        holders = {i for i, m in enumerate(matched) if m >= lead}
        key = request.home_key
        others = sorted(
            (i for i in range(len(candidates)) if i not in holders),
            key=lambda i: (candidates[i].recent, -hrw_score(key, candidates[i].name)),
        )
        missing = k - len(holders)
        if missing <= 0 and others:
            # Against the median other, not the quietest: Poisson noise always leaves some
            # replica well below the rest, and measured against it the rule copied on noise.
            typical = candidates[others[len(others) // 2]].recent
            valley = typical * (1 + self.policy.load.balance_eps) + 1
            missing = int(min(candidates[i].recent for i in holders) > valley)
        return holders | set(others[:missing])

    def _least_turnover(self, near: list[int], candidates: tuple[Candidate, ...], key: int) -> int:
        """Where a prompt that is its own text goes: the replica whose cache has taken the least
        new text (then the least recently loaded, then rendezvous order)."""
        turnover = self._turnover

        def order(i: int) -> tuple[float, float, float]:
            name = candidates[i].name
            return turnover.get(name, 0.0), candidates[i].recent, -hrw_score(key, name)

        return min(near, key=order)

    def _place(self, near: list[int], candidates: tuple[Candidate, ...], key: int) -> int:
        """Where a prefix no fast replica is warm for starts (or is copied to): the replica whose
        recent requests and shared prefixes held, each against the pool's mean, sum least. A
        replica fills on two counts, and by request counts alone the one that is quiet because
        its prefixes are rare collects every new prefix: on Zipf one replica of 8 took 10-12
        prefixes while another held 1-3, and its cache evicted 6 of them before their next
        request."""
        block = self.prefix.block_bytes
        # One request and one block more on each: an idle pool's zero means divide nothing.
        held = [self.index_lead_bytes(c.name) + block for c in candidates]
        recent = [c.recent + 1 for c in candidates]
        mean_held, mean_recent = sum(held) / len(held), sum(recent) / len(recent)
        return min(
            near,
            key=lambda i: (
                recent[i] / mean_recent + held[i] / mean_held,
                -hrw_score(key, candidates[i].name),
            ),
        )


def _least_loaded(among: list[int], candidates: tuple[Candidate, ...], key: int) -> int:
    """Among equally fast replicas, those warm for the prompt (holding it, or a spread home of
    a hot prefix) if any: a cold copy elsewhere costs a prefill and cache room, so balance only
    moves a prompt between warm replicas. Several warm replicas share its traffic evenly;
    ties follow the prefix's rendezvous order, so gateway instances sharing counts choose
    alike."""
    return min(among, key=lambda i: (candidates[i].recent, -hrw_score(key, candidates[i].name)))
