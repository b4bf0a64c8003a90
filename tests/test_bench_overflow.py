"""`llm-gateway bench overflow`: every target serves the whole workload, the quality rule's
hard requests are the ones the offline share counts, and only overflow sends an easy request
large."""

from __future__ import annotations

from bench.close_calls import Workload, build_workload
from bench.tier_overflow import Target, hard_requests, measure, table
from bench.workloads import Conversation


def test_the_hard_requests_are_those_the_quality_rule_sends_large() -> None:
    conversations = tuple(Conversation(f"c{i}", 0, "", ("q",) * 3, 8) for i in range(2))
    workload = Workload(conversations, (0.0, 0.0), ((0.1, 0.9, 0.2), (0.2, 0.3, 0.1)))
    assert hard_requests(workload, 0.5) == {("c0", 1), ("c0", 2)}
    assert len(hard_requests(workload, 0.15)) / workload.requests == workload.share_large(0.15)


async def test_without_overflow_the_pools_serve_the_quality_rule_and_only_overflow_climbs() -> None:
    workload = build_workload(10, 20.0, seed=0)
    outcomes = await measure(workload, small_replicas=1, large_replicas=1)
    hard = hard_requests(workload, outcomes[0].threshold)
    none, saturation, predicted, same = (Target(o, hard) for o in outcomes)
    for target in (none, saturation, predicted, same):
        assert len(target.outcome.ok()) == workload.requests
    assert none.climbs() == same.climbs() == 0
    assert none.outcome.share_large() == workload.share_large(none.outcome.threshold)
    assert predicted.outcome.share_large() >= none.outcome.share_large()
    assert none.ttft_ms(90, hard=True) > 0 and none.ttft_ms(90, hard=False) > 0  # both kinds sent
    text = table([none, saturation, predicted, same])
    assert "| overflow by prediction |" in text and "| quality rule, same share |" in text
