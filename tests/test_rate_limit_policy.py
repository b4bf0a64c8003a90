"""The `limits:` section of the policy file: validated, printed by check-policy with its
defaults, and keys only ever as hashes (`llm-gateway hash-key` makes them)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from router_policies.schema import InvalidPolicy, load_policy

ACME = hashlib.sha256(b"sk-acme").hexdigest()
POOLS = {"small": {"model": "m", "replicas": ["http://127.0.0.1:9001"]}}


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _write(tmp_path: Path, limits: object) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({"pools": POOLS, "limits": limits}))
    return path


def test_hash_key_prints_the_sha256_of_the_key_read_from_stdin() -> None:
    result = _cli("hash-key", stdin="sk-acme\n")
    assert result.returncode == 0
    assert result.stdout.strip() == ACME


def test_check_policy_prints_the_limits_with_their_defaults(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {"tenants": {"acme": {"api_key_sha256": [ACME.upper()], "requests_per_minute": 60}}},
    )
    result = _cli("check-policy", str(path))
    assert result.returncode == 0, result.stderr
    limits = yaml.safe_load(result.stdout)["limits"]
    assert limits == {
        "tenants": {
            "acme": {"api_key_sha256": [ACME], "requests_per_minute": 60, "tokens_per_minute": None}
        },
        "allow_unknown_keys": False,
        "completion_tokens_estimate": 256,
    }


def test_a_key_in_clear_is_refused_without_being_echoed(tmp_path: Path) -> None:
    path = _write(tmp_path, {"tenants": {"acme": {"api_key_sha256": ["sk-live-secret-123"]}}})
    result = _cli("check-policy", str(path))
    assert result.returncode != 0
    assert "limits.tenants.acme.api_key_sha256" in result.stderr and "hash-key" in result.stderr
    assert "sk-live-secret-123" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        (
            {"tenants": {"a": {"api_key_sha256": [ACME]}, "b": {"api_key_sha256": [ACME]}}},
            "share a key hash",
        ),
        ({"tenants": {"a": {"api_key_sha256": [ACME, ACME]}}}, "listed twice"),
        ({"tenants": {"a": {"api_key_sha256": []}}}, "api_key_sha256"),
        (
            {"tenants": {"a": {"api_key_sha256": [ACME], "requests_per_minute": 0}}},
            "requests_per_minute",
        ),
        ({"tenants": {"a": {"api_key_sha256": [ACME], "rpm": 5}}}, "rpm"),
    ],
)
def test_mistakes_in_the_limits_name_the_field(
    tmp_path: Path, limits: object, problem: str
) -> None:
    with pytest.raises(InvalidPolicy) as error:
        load_policy(_write(tmp_path, limits))
    assert problem in str(error.value)
