"""Servers run as real subprocesses: started healthy, stopped by their own PID, ports released."""

import asyncio
import os
import signal
import socket
import sys

import aiohttp
import pytest

from replica.processes import (
    ManagedProcess,
    ProcessStartError,
    free_port,
    start_all,
    start_sim_replicas,
)
from tests.conftest import eventually


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # What a server restarting on the port would do; TIME_WAIT leftovers do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_two_sim_replicas_start_answer_and_stop() -> None:
    replicas = await start_sim_replicas(2, model="tiny", decode_step_s=0.0, num_blocks=64)
    try:
        assert len({r.pid for r in replicas}) == 2
        assert len({r.url for r in replicas}) == 2
        async with aiohttp.ClientSession() as session:
            for replica in replicas:
                async with session.get(replica.url + "/health") as response:
                    assert response.status == 200
                async with session.get(replica.url + "/metrics") as response:
                    text = await response.text()
                    assert 'num_gpu_blocks="64"' in text
                    assert "_created" not in text, "like vLLM, no *_created series"
                async with session.post(
                    replica.url + "/v1/completions",
                    json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                ) as response:
                    assert response.status == 200
    finally:
        codes = [await replica.stop() for replica in replicas]

    assert codes == [0, 0], "SIGTERM is a clean shutdown"
    for replica in replicas:
        assert not replica.is_running()
        assert replica.log_path is not None and not replica.log_path.exists()
        assert port_is_free(int(replica.url.rsplit(":", 1)[1]))


async def test_a_child_that_dies_at_start_reports_its_output() -> None:
    process = ManagedProcess(
        [sys.executable, "-c", "import sys; print('no model here', file=sys.stderr); sys.exit(3)"],
        f"http://127.0.0.1:{free_port()}",
        name="doomed",
    )
    with pytest.raises(ProcessStartError, match="no model here"):
        await process.start(timeout_s=10)
    assert process.returncode == 3
    assert process.log_path is not None and process.log_path.exists(), "kept for a post-mortem"
    process.log_path.unlink()


async def test_stop_kills_a_child_that_ignores_sigterm() -> None:
    port = free_port()
    script = (
        "import http.server, signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}),"
        " http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    process = ManagedProcess([sys.executable, "-c", script], f"http://127.0.0.1:{port}")
    await process.start(health_path="/", timeout_s=10)
    assert await process.stop(grace_s=0.3) == -9
    assert port_is_free(port)
    assert process.log_path is not None and not process.log_path.exists(), "a stop asked for"


async def test_a_child_that_failed_on_its_own_keeps_its_log_through_the_stop() -> None:
    process = ManagedProcess(
        [sys.executable, "-c", "import sys; print('oom', file=sys.stderr); sys.exit(3)"],
        f"http://127.0.0.1:{free_port()}",
    )
    with pytest.raises(ProcessStartError):
        await process.start(timeout_s=10)
    assert await process.stop() == 3
    assert process.log_path is not None and process.log_path.exists(), "kept for a post-mortem"
    process.log_path.unlink()


async def test_a_start_the_caller_gives_up_on_leaves_no_log() -> None:
    process = ManagedProcess(
        [sys.executable, "-c", "import time; time.sleep(60)"], f"http://127.0.0.1:{free_port()}"
    )
    starting = asyncio.create_task(process.start(timeout_s=60))
    assert await eventually(process.is_running)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert not process.is_running()
    assert process.log_path is not None and not process.log_path.exists()


async def test_processes_started_before_the_caller_gives_up_are_stopped_too() -> None:
    port = free_port()
    quick = ManagedProcess(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        f"http://127.0.0.1:{port}",
    )
    never = ManagedProcess(
        [sys.executable, "-c", "import time; time.sleep(60)"], f"http://127.0.0.1:{free_port()}"
    )
    quick_up = asyncio.Event()

    async def start_quick() -> ManagedProcess:
        await quick.start(health_path="/", timeout_s=10)
        quick_up.set()
        return quick

    async def start_never() -> ManagedProcess:
        await never.start(timeout_s=60)
        return never

    starting = asyncio.create_task(start_all([start_quick(), start_never()]))
    await asyncio.wait_for(quick_up.wait(), 10)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    for process in (quick, never):
        assert not process.is_running()
        assert process.log_path is not None and not process.log_path.exists()


async def test_a_child_that_never_becomes_healthy_is_killed() -> None:
    process = ManagedProcess(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        f"http://127.0.0.1:{free_port()}",
        name="silent",
    )
    with pytest.raises(ProcessStartError, match="not healthy"):
        await process.start(timeout_s=0.3)
    assert process.returncode == -9 and not process.is_running()
    assert process.log_path is not None
    process.log_path.unlink()


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux-only")
async def test_children_exit_when_their_parent_dies_abruptly() -> None:
    port = free_port()
    parent = (
        "import asyncio, os, sys\n"
        "from replica.processes import ManagedProcess\n"
        "async def main():\n"
        f"    child = ManagedProcess([sys.executable, '-m', 'http.server', '{port}',"
        f" '--bind', '127.0.0.1'], 'http://127.0.0.1:{port}', keep_log=True)\n"
        "    await child.start(health_path='/', timeout_s=10)\n"
        "    print(child.pid, child.log_path, flush=True)\n"
        "    os._exit(0)\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", parent, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    pid_text, log_path = out.decode().split()
    child_pid = int(pid_text)
    os.unlink(log_path)
    for _ in range(100):
        if not _alive(child_pid):
            break
        await asyncio.sleep(0.02)
    else:
        os.kill(child_pid, signal.SIGKILL)
        pytest.fail("the child outlived its parent")
    assert port_is_free(port)
