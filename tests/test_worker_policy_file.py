"""`serve --workers N`: the parent keeps the policy file as the workers reload it, for the
workers it starts in place of one that ended: read whole, never a file caught mid-write, and
handed on with when it was read, so that a worker started on an older reading reads the file
again."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gateway import cli
from gateway.policy.check import load_checked_policy
from gateway.policy.reload import PolicyHolder, Stamp
from gateway.settings import Settings
from gateway.shared_state.worker_mesh import MeshPlace
from gateway.supervisor import _Supervisor
from gateway.telemetry import logs
from gateway.watchdog import Heartbeats
from router_policies.schema import Policy
from tests.conftest import policy_holder, pool_policy

URL = "http://127.0.0.1:9101"
TENANTS = {"limits": {"tenants": {"acme": {"api_key_sha256": ["a" * 64]}}}}
LOOK_S = 0.05
"""The policy watch's interval in these tests."""


def policy_text(eps: float) -> str:
    """A policy with a tenant, its `limits:` last: cut before it, it still parses."""
    return yaml.safe_dump(
        {**pool_policy([URL], load={"balance_eps": eps}), **TENANTS}, sort_keys=False
    )


def supervisor(path: Path, tmp_path: Path, run: Any = None) -> _Supervisor:
    settings = Settings(workers=2, port=8999, policy=path, policy_watch_interval_s=LOOK_S)
    return _Supervisor(settings, load_checked_policy(path), tmp_path, run)


def looks(parent: _Supervisor, n: int) -> None:
    for _ in range(n):
        time.sleep(LOOK_S * 1.5)
        parent.keep_policy()


def replacement_of(
    parent: PolicyHolder, record: Callable[[bool], None] = lambda ok: None
) -> PolicyHolder:
    """What a replacement worker holds: the parent's policy, read when the parent read it,
    whatever the file on disk has become since."""
    assert parent.path is not None
    worker = PolicyHolder(parent.fleet.policy, parent.path, record)
    worker.read_when(parent.read_at)
    return worker


def eps_and_tenants(policy: Policy) -> tuple[float, bool]:
    return policy.pools["small"].load.balance_eps, bool(policy.limits.tenants)


def test_the_parent_reads_a_policy_file_written_in_parts_once_it_stands_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(0.25))
    parent = supervisor(path, tmp_path)
    whole = policy_text(0.5)
    # An editor saving in place: between its writes the file is a valid policy without
    # `limits:`, which a replacement started on it would serve to every caller without a key.
    path.write_text(whole[: whole.index("limits:")])
    looks(parent, 1)
    assert eps_and_tenants(parent.policy.fleet.policy) == (0.25, True)
    path.write_text(whole)
    looks(parent, 2)
    assert eps_and_tenants(parent.policy.fleet.policy) == (0.5, True)


def test_a_replacement_is_handed_the_policy_and_when_the_parent_read_it(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(0.25))
    seen = tmp_path / "seen.json"

    def run(
        _settings: Settings,
        policy: Policy,
        read_at: Stamp | None,
        _place: MeshPlace,
        _beat: tuple[Heartbeats, int],
    ) -> int:  # in the forked worker
        seen.write_bytes(orjson.dumps([*eps_and_tenants(policy), read_at]))
        return 0

    parent = supervisor(path, tmp_path, run)
    stamp = parent.policy.read_at
    path.write_text(policy_text(0.75))  # not yet read by the parent
    _, status = os.waitpid(parent.start(0), 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert orjson.loads(seen.read_bytes()) == [0.25, True, list(stamp or ())]


async def test_a_worker_started_on_an_older_reading_reads_the_file_changed_since(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(0.25))
    older = policy_holder(path)
    path.write_text(policy_text(0.5))
    worker = replacement_of(older)
    assert not worker.settled_change()  # changed since the reading: seen by the first poll
    assert worker.settled_change()  # and read once it stands still
    assert (await worker.reload()).ok
    assert eps_and_tenants(worker.fleet.policy) == (0.5, True)


async def test_a_worker_started_after_the_parent_failed_to_load_the_file_fails_it_too(
    tmp_path: Path,
) -> None:
    # Its own reload failing is what sets its gateway_policy_last_reload_successful to 0:
    # started on the parent's last good policy as if it were the file's, it would say 1.
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(0.25))
    parent = policy_holder(path)
    path.write_text("pools: [")
    assert not (await parent.reload()).ok
    outcomes: list[bool] = []
    worker = replacement_of(parent, outcomes.append)
    assert not worker.settled_change()
    assert worker.settled_change()
    assert not (await worker.reload()).ok
    assert outcomes == [False] and eps_and_tenants(worker.fleet.policy) == (0.25, True)


def test_an_edit_landing_while_the_gateway_starts_is_read_once_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The file is stamped before `serve` reads it: an edit (a ConfigMap swap) landing between
    # that read and the gateway's start is a change the gateway reads, not one it takes as read.
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(0.25))
    read = cli._load_or_explain

    def edited_meanwhile(at: Path) -> Policy | None:
        policy = read(at)
        path.write_text(policy_text(0.5))
        return policy

    monkeypatch.setattr(cli, "_load_or_explain", edited_meanwhile)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the test's own handlers stay
    monkeypatch.setattr(logs, "configure", lambda _: None)
    config = cli._process_config([("policy", "--policy", str(path))])
    assert config is not None
    _, policy, read_at = config
    holder = PolicyHolder(policy, path, lambda ok: None)
    holder.read_when(read_at)
    assert holder.changed_on_disk()
