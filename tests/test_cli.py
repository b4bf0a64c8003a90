"""The command line operators use to check a policy before it goes live."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "router_policies" / "examples").glob("*.yaml"))


def llm_gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_shipped_example_policy_is_valid(example: Path) -> None:
    result = llm_gateway("check-policy", str(example))
    assert result.returncode == 0, result.stderr
    assert "balance_eps:" in result.stdout  # defaults are filled in


def test_an_invalid_policy_names_the_field_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "pools:\n  small:\n    model: m\n    replicas: [http://a:1]\n    policy: fastest\n"
    )
    result = llm_gateway("check-policy", str(bad))
    assert result.returncode != 0
    assert "line 5: pools.small.policy" in result.stderr


def test_a_tier_naming_a_missing_pool_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "pools:\n  small:\n    model: m\n    replicas: [http://a:1]\n"
        "tiers:\n  auto:\n    small: small\n    large: huge\n"
    )
    result = llm_gateway("check-policy", str(bad))
    assert result.returncode != 0
    assert "tiers.auto.large: no pool named 'huge'" in result.stderr


def test_a_missing_policy_file_is_a_clear_error(tmp_path: Path) -> None:
    result = llm_gateway("check-policy", str(tmp_path / "nope.yaml"))
    assert result.returncode != 0
    assert "cannot read policy file" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_an_invalid_policy_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {}\n")
    result = llm_gateway("serve", "--policy", str(bad), "--port", "0")
    assert result.returncode != 0
    assert "pools" in result.stderr and "Traceback" not in result.stderr


def test_serve_without_any_policy_says_how_to_give_one() -> None:
    result = llm_gateway("serve", "--port", "0")
    assert result.returncode == 2
    assert "GATEWAY_POLICY" in result.stderr


def test_the_contract_names_every_benchmark() -> None:
    from bench.cli import BENCHMARKS

    contract = (Path(__file__).parents[1] / "docs" / "contract.md").read_text()
    line = next(line for line in contract.splitlines() if "`llm-gateway bench " in line)
    assert set(line.split("`llm-gateway bench ")[1].split(" ")[0].split("|")) == set(BENCHMARKS)
