"""Conversations sharing a system prompt too short to be a home (under min_match_ratio of their
prompt): new ones spread over the pool as conversations without it do, and each one's later
turns still go back to the replica holding its history."""

from __future__ import annotations

import random

from router_policies.decision import Decision, PoolSnapshot, Route
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures
from router_policies.policies.prefix_aware import PrefixAware
from tests.routing import NAMES, POOL, candidate, choose, features, snapshot

# ~1.1 KB of system prompt (8 blocks), shorter than each conversation's ~1.3 KB opening
# question: the shape of one app's conversations.
LEAD = b"You are the ACME support assistant. " * 32


def opening(i: int, lead: bytes = LEAD) -> RequestFeatures:
    question = f"conversation {i} asks: ".encode() + f"a question of its own {i} ".encode() * 52
    return features(CanonicalPrompt(lead + question, lead_bytes=len(lead)))


def second_turn(i: int, lead: bytes = LEAD) -> RequestFeatures:
    first = opening(i, lead)
    assert first.hashed_bytes < 2 * len(lead) + 1400  # the lead is under half the prompt
    history = lead + f"conversation {i} asks: ".encode()
    history += f"a question of its own {i} ".encode() * 52
    history += f"an answer {i} ".encode() * 40 + f"and a follow-up {i} ".encode() * 10
    return features(CanonicalPrompt(history, lead_bytes=len(lead)))


def open_conversations(policy: PrefixAware, count: int, lead: bytes = LEAD) -> list[str]:
    """Opens ``count`` conversations one after another, as the gateway would, each counted in
    the replicas' recent load; returns where each went."""
    recent = dict.fromkeys(NAMES, 0.0)
    placed = []
    for i in range(count):
        request = opening(i, lead)
        snap = PoolSnapshot(tuple(candidate(n, recent=recent[n]) for n in NAMES), now=i * 0.1)
        decision = choose(policy, snap, request)
        assert decision.route is Route.LEAST_LOADED
        policy.record(request, decision, now=i * 0.1)
        recent[decision.replica] += 1
        placed.append(decision.replica)
    return placed


def test_new_conversations_sharing_a_short_system_prompt_spread_over_the_pool() -> None:
    """Charged a copy of the system prompt everywhere but on the replica that took the first
    conversation, all 16 went there; counted as held everywhere, the lead draws none there,
    and they spread by cache turnover, four to each replica, as without it."""
    placed = open_conversations(PrefixAware(POOL), 16)
    assert sorted(placed.count(n) for n in NAMES) == [4, 4, 4, 4], placed
    without_lead = open_conversations(PrefixAware(POOL), 16, lead=b"")
    assert sorted(without_lead.count(n) for n in NAMES) == [4, 4, 4, 4], without_lead


def test_a_conversations_next_turn_stays_with_its_history_despite_a_queue_there() -> None:
    """The copy charge still protects the history beyond the lead: with ~0.2 s of prefill
    queued where each conversation went, and the others idle, every second turn goes back
    there as a prefix hit."""
    policy = PrefixAware(POOL)
    placed = open_conversations(policy, 8)
    for i, home in enumerate(placed):
        queued = candidate(home, pending_prefill_tokens=2000, pending_requests=1, running=1)
        decision = choose(policy, snapshot(queued), second_turn(i))
        assert (decision.replica, decision.route) == (home, Route.PREFIX_HIT), i


def test_a_lead_worth_a_home_still_gathers_its_conversations() -> None:
    """Only a lead under min_match_ratio of the prompt counts as held everywhere: a system
    prompt that is most of it keeps its home, where its next conversation goes too."""
    lead = LEAD * 4
    policy = PrefixAware(POOL)
    first = choose(policy, snapshot(), opening(0, lead))
    assert first.route is Route.PREFIX_HOME
    policy.record(opening(0, lead), first, now=0.0)
    busier = candidate(first.replica, recent=1.0)
    decision = choose(policy, snapshot(busier), opening(1, lead))
    assert (decision.replica, decision.route) == (first.replica, Route.PREFIX_HIT)


# --- requests with no shared lead route exactly as before ------------------------------------


_ROUTES = {Route.PREFIX_HIT: "h", Route.LEAST_LOADED: "l", Route.PREFIX_HOME: "p"}


def _no_lead_replay() -> list[str]:
    """A trace of conversations without a system prompt (as Mooncake's): openings, later
    turns, some prompts sharing an opening block, under shifting queues."""
    policy = PrefixAware(POOL)
    draw = random.Random(7)
    history: dict[int, bytes] = {}
    decisions = []
    for step in range(80):
        conv = draw.randrange(12)
        text = history.get(conv, f"task {conv % 3} ".encode() * 20 + f"conv {conv} ".encode())
        text += f"turn {step} of {conv} ".encode() * draw.randrange(5, 120)
        history[conv] = text
        request = features(CanonicalPrompt(text))
        loads = [
            candidate(
                n,
                recent=float(draw.randrange(6)),
                pending_prefill_tokens=float(draw.choice((0, 0, 300, 1500, 6000))),
                pending_requests=draw.randrange(3),
                running=float(draw.randrange(8)),
            )
            for n in NAMES
        ]
        decision = choose(policy, PoolSnapshot(tuple(loads), now=step * 0.5), request)
        policy.record(request, Decision(decision.replica, decision.route), now=step * 0.5)
        decisions.append(decision.replica + _ROUTES[decision.route])
    return decisions


NO_LEAD_DECISIONS = (
    # Recorded before a shared lead too short to be a home counted as held everywhere: each
    # decision as its replica and route (h: prefix-hit, l: least-loaded).
    "cl al al bl bl al ah al ah bl bl bl dl bh dh cl bl ah ch bh "
    "cl bh ah bl dh al ah ah bh bh ah ah ah ah ah bl bh ah bh dl "
    "bh ah ah cl bh bh bh bh dl dh bh bh ch ch ch bl ah ch ah dh "
    "bh al dl ch ah ch ch bh ah dh ch bh bh bh dh bh ch bh ch ch"
).split()


def test_prompts_without_a_shared_lead_route_as_before() -> None:
    assert _no_lead_replay() == NO_LEAD_DECISIONS
