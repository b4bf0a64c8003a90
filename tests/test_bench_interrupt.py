"""Ctrl-C, SIGTERM and SIGHUP end `llm-gateway demo` and every `bench` command alike: what it
started is stopped, its files leave $TMPDIR, and it says so in one line with 128 + the signal's
number as its exit status, never a traceback."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import uvloop

import bench.cli
from tests.command_line import ROOT


def test_a_signal_cancels_the_run_so_that_its_clean_up_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cleaned: list[str] = []

    async def work() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(60)
            return 0
        finally:
            cleaned.append("children stopped")

    assert bench.cli.interruptible("tool", lambda: uvloop.run(work())) == 128 + signal.SIGTERM
    assert cleaned == ["children stopped"]
    assert capsys.readouterr().err.splitlines() == [
        "tool: interrupted (SIGTERM); stopped what it had started"
    ]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "put back as it was"


def _interrupted(
    args: list[str], signum: int, tmp: Path, started: str
) -> subprocess.CompletedProcess[str]:
    """`llm-gateway ARGS` with its own $TMPDIR, sent ``signum`` once a file named ``started``*
    is there (a child under way); its exit status and output."""
    child = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob(f"{started}*")) and child.poll() is None:
            assert time.monotonic() < deadline, "never started"
            time.sleep(0.05)
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    return subprocess.CompletedProcess(args, child.returncode, out, err)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("started", ["sim-replica-", "gateway-policy-"])
def test_bench_soak_stops_in_one_line_and_leaves_nothing(
    signum: signal.Signals, started: str, tmp_path: Path
) -> None:
    """Sent while the replicas start, or while the gateway does."""
    out = tmp_path / "out"
    args = ["bench", "soak", "--duration-s", "60", "--out", f"{out}/r.md", "--plot", f"{out}/p.png"]
    done = _interrupted(args, signum, tmp_path, started)
    assert done.returncode == 128 + signum, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("llm-gateway bench soak: interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.timeout(120)
def test_the_demo_stops_on_sigterm_and_leaves_nothing(tmp_path: Path) -> None:
    done = _interrupted(["demo", "--no-progress"], signal.SIGTERM, tmp_path, "gateway-policy-")
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "llm-gateway demo: interrupted (SIGTERM); stopped what it had started"
    )
    assert list(tmp_path.iterdir()) == []
