"""The policy file: defaults filled in from one place, mistakes named by field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from router_policies.schema import (
    InvalidPolicy,
    PolicyName,
    effective_policy_yaml,
    load_policy,
    parse_policy,
)

MINIMAL = {"pools": {"small": {"model": "llama-3.1-8b", "replicas": ["http://127.0.0.1:9001/"]}}}


def test_minimal_policy_gets_every_default() -> None:
    policy = parse_policy(MINIMAL)
    pool = policy.pools["small"]
    assert pool.policy is PolicyName.PREFIX_AWARE
    assert pool.replicas == ["http://127.0.0.1:9001"]
    text = effective_policy_yaml(policy)
    for key in ("block_bytes", "min_match_ratio", "balance_eps", "target_queue_per_replica"):
        assert key in text


def _error_fields(data: object) -> list[str]:
    with pytest.raises(ValidationError) as info:
        parse_policy(data)
    return [".".join(str(p) for p in e["loc"]) for e in info.value.errors()]


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        ({"model": "m", "replicas": []}, "pools.small.replicas"),
        ({"model": "m", "replicas": ["ftp://x"]}, "pools.small.replicas"),
        ({"model": "m", "replicas": ["http://a:1", "http://a:1/"]}, "pools.small.replicas"),
        ({"model": "m", "replicas": ["http://a:1"], "policy": "random"}, "pools.small.policy"),
        ({"model": "m", "replicas": ["http://a:1"], "polcy": "x"}, "pools.small.polcy"),
        ({"replicas": ["http://a:1"]}, "pools.small.model"),
        (
            {"model": "m", "replicas": ["http://a:1"], "load": {"balance_eps": -1}},
            "pools.small.load.balance_eps",
        ),
    ],
)
def test_invalid_pools_name_the_field(pool: dict[str, object], field: str) -> None:
    assert field in _error_fields({"pools": {"small": pool}})


def test_two_pools_cannot_serve_one_model() -> None:
    pool = {"model": "m", "replicas": ["http://a:1"]}
    assert _error_fields({"pools": {"a": pool, "b": pool}}) == ["pools.b.model"]


def test_a_policy_needs_a_pool() -> None:
    assert "pools" in _error_fields({"pools": {}})


TIERED = """\
pools:
  small: {model: s, replicas: ["http://127.0.0.1:9001"]}
  large: {model: l, replicas: ["http://127.0.0.1:9002"]}
tiers:
  auto:
    small: small
"""


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (
            "    large: large\n    calibration: {target_large_share: 0.3, window: 50, min_samples: 1000}\n",
            "line 8: tiers.auto.calibration.min_samples: min_samples (1000) is above window (50): "
            "calibration would never start; lower min_samples or raise window",
        ),
        (
            "    large: large\n    calibration: {target_large_share: 0.3, min_samples: 2000}\n",
            "line 8: tiers.auto.calibration.min_samples: min_samples (2000) is above window "
            "(1000): "
            "calibration would never start; lower min_samples or raise window",
        ),
        (
            "    large: small\n",
            "line 7: tiers.auto.large: small and large are both pool 'small': a tier needs "
            "two pools (a client that wants one pool names its model)",
        ),
    ],
    ids=["min_samples-above-window", "min_samples-above-the-default-window", "one-pool"],
)
def test_tier_settings_that_could_never_work_are_refused_naming_the_field(
    tmp_path: Path, settings: str, problem: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(TIERED + settings)
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    assert info.value.problems == [problem]


def test_a_calibration_window_may_hold_exactly_min_samples() -> None:
    tier = {"small": "small", "large": "large"}
    calibration = {"target_large_share": 0.3, "window": 50, "min_samples": 50}
    pools = {
        "small": {"model": "s", "replicas": ["http://127.0.0.1:9001"]},
        "large": {"model": "l", "replicas": ["http://127.0.0.1:9002"]},
    }
    parse_policy({"pools": pools, "tiers": {"auto": {**tier, "calibration": calibration}}})
