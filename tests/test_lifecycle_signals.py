"""Stop signals at the edges of a gateway's life: while it starts, a second one while it drains,
and the parent of `serve --workers N` killed outright. Each ends in an orderly way, says so in
one log line, and leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from bench.host import children
from bench.launcher import start_gateway
from replica.processes import ProcessStartError
from tests.conftest import FAST_PROBES, eventually, pool_policy, running_sims
from tests.hardening import long_stream_under_way, starting_against_a_silent_replica
from tests.shared_state import every_worker_up


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_stop_signal_while_it_starts_ends_it_with_status_0_and_one_line_unlistened(
    sig: signal.Signals, tmp_path: Path
) -> None:
    env = {"GATEWAY_HEALTH_TIMEOUT_S": "3"}
    async with starting_against_a_silent_replica(tmp_path, env) as (gateway, starting):
        os.kill(gateway.pid, sig)
        with pytest.raises(ProcessStartError):  # it exited and never answered
            await starting
        log = gateway.log_tail()
        assert gateway.returncode == 0, log
        assert "stopping: signal received while starting; exiting without listening" in log
        assert "listening on" not in log and "Traceback" not in log


@pytest.mark.parametrize(
    ("drain_timeout_s", "second_signal", "logged"),
    [
        ("30", True, "stopping: second signal received, ending 1 requests in flight"),
        ("0.5", False, "stopping: drain deadline reached, ending 1 requests in flight"),
    ],
    ids=["second signal", "deadline"],
)
async def test_what_ended_a_drain_early_is_logged_as_it_was(
    drain_timeout_s: str, second_signal: bool, logged: str
) -> None:
    # An operator reading "deadline reached" raises the drain timeout: a second signal is no
    # reason to.
    env = {"GATEWAY_SHUTDOWN_DELAY_S": "0", "GATEWAY_DRAIN_TIMEOUT_S": drain_timeout_s}
    async with long_stream_under_way(env) as (gw, _, response):
        os.kill(gw.pid, signal.SIGTERM)

        def draining() -> bool:
            return "stopping: /ready answers 503" in gw.log_tail()

        assert await eventually(draining)
        if second_signal:
            os.kill(gw.pid, signal.SIGTERM)

        def exited() -> bool:
            return gw.returncode is not None

        assert await eventually(exited)
        log = gw.log_tail()
        assert gw.returncode == 0, log
        assert logged in log
        response.close()


def _run_dirs(tmp: Path) -> list[Path]:
    return list(tmp.glob("llm-gateway-workers-*"))


def _alive(pid: int) -> bool:
    """Running, not a zombie: a worker whose parent died is reaped by whoever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def test_workers_whose_parent_was_killed_outright_leave_no_run_directory_behind(
    tmp_path: Path,
) -> None:
    # The parent's cleanup never runs: the workers (stopped by their parent-death signal) are
    # the last to know where their sockets are.
    env = {**FAST_PROBES, "GATEWAY_WORKERS": "2", "TMPDIR": str(tmp_path)}
    async with running_sims(1) as [replica]:
        gateway = await start_gateway(pool_policy([replica.url]), env=env)
        workers: list[int] = []
        try:
            assert await eventually(every_worker_up(gateway))
            assert len(_run_dirs(tmp_path)) == 1
            workers = children(gateway.pid)
            os.kill(gateway.pid, signal.SIGKILL)

            def workers_gone() -> bool:
                return not any(_alive(pid) for pid in workers)

            assert await eventually(workers_gone, within_s=15)
            assert _run_dirs(tmp_path) == []
        finally:
            for pid in filter(_alive, workers):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await gateway.stop()
