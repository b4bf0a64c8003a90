"""The command line operators use to check a policy before it goes live."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "router_policies" / "examples").glob("*.yaml"))


ROOT = Path(__file__).parent.parent


def llm_gateway(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True, text=True, timeout=60, input=stdin,
    )  # fmt: skip


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


def test_check_policy_of_an_empty_path_says_the_path_is_empty() -> None:
    # Before: "cannot read policy file .: Is a directory" (Path("") is the current directory).
    result = llm_gateway("check-policy", "")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: the policy file path is empty"]


def test_hash_key_hashes_the_key_read_from_stdin() -> None:
    result = llm_gateway("hash-key", stdin="sk-secret\n")
    assert result.returncode == 0
    # sha256("sk-secret"): the final newline is not part of the key.
    assert result.stdout.strip() == hashlib.sha256(b"sk-secret").hexdigest()


@pytest.mark.parametrize(
    "given", [["sk-secret"], ["--key=sk-secret"], ["--key", "sk-secret"], ["--", "sk-secret"]]
)
def test_hash_key_refuses_a_key_given_as_an_argument_without_printing_it(
    given: list[str],
) -> None:
    # Before, argparse answered "unrecognized arguments: sk-secret": the key in the output
    # (and in any log of it), besides the shell history the argument already reached.
    result = llm_gateway("hash-key", *given, stdin="sk-other\n")
    assert result.returncode == 2
    assert "sk-secret" not in result.stdout + result.stderr
    assert result.stdout == ""
    assert "stdin" in result.stderr


def test_hash_key_takes_ctrl_d_at_its_hidden_prompt_as_no_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import getpass

    from gateway.cli import main

    def ctrl_d(prompt: str = "") -> str:
        raise EOFError

    monkeypatch.setattr(sys, "stdin", io.StringIO())
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)  # a terminal: the hidden prompt
    monkeypatch.setattr(getpass, "getpass", ctrl_d)
    assert main(["hash-key"]) == 2
    assert capsys.readouterr().err == "error: no key on stdin\n"


def test_hash_key_help_still_works() -> None:
    result = llm_gateway("hash-key", "--help")
    assert result.returncode == 0 and "stdin" in result.stdout


def test_the_contract_asks_for_no_extra_the_plain_install_holds() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("grpcio") for d in project["dependencies"])
    assert project["optional-dependencies"]["epp"] == []
    contract = (ROOT / "docs" / "contract.md").read_text()
    commands = contract.split("### Command line", 1)[1].split("###", 1)[0]
    assert "need the `epp` extra" not in commands
