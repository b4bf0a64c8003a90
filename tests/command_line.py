"""Helpers of the command-line tests: `llm-gateway` as a child process, a command's parser
alone, and the checks every refused argument must pass (one clear line, no traceback)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_POLICY = ROOT / "router_policies" / "examples" / "single-pool.yaml"


@dataclass(frozen=True, slots=True)
class Ran:
    code: int
    out: str
    err: str

    def refused(self, *words: str) -> bool:
        """Exit status 2, no traceback, and a last line of stderr that is argparse's or our own
        `error:` line holding each of ``words``."""
        last = self.err.strip().splitlines()[-1] if self.err.strip() else ""
        return (
            self.code == 2
            and "Traceback" not in self.err
            and "error:" in last
            and all(word in last for word in words)
        )


def llm_gateway_process(
    *args: str, timeout_s: float = 30, env: dict[str, str] | None = None
) -> Ran:
    """`llm-gateway ARGS` in a child process; a command still running after ``timeout_s``
    (one that should have refused its arguments at once) is killed and reads as exit 124."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True,
            timeout=timeout_s, cwd=ROOT, env={**os.environ, **(env or {})},
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        return Ran(124, _text(exc.stdout), _text(exc.stderr))
    return Ran(done.returncode, done.stdout, done.stderr)


def logged_port(args: Sequence[str], line_with: str, port_in: str, timeout_s: float = 30) -> int:
    """Starts `llm-gateway ARGS` (a server told to listen on port 0), reads its log up to the
    line holding ``line_with``, and returns the port that line names (``port_in``'s group),
    once it is seen to take connections; the server is then stopped."""
    argv = [sys.executable, "-m", "gateway.cli", *args]
    with subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True) as server:
        try:
            assert server.stderr is not None
            deadline = time.monotonic() + timeout_s
            line = ""
            while line_with not in line and time.monotonic() < deadline:
                line = server.stderr.readline()
            found = re.search(port_in, line)
            assert found is not None, line
            port = int(found.group(1))
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return port
        finally:
            server.terminate()
            server.wait(timeout=30)


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port this process listens on, for a command told to listen there too."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def parsed(parser: argparse.ArgumentParser, *args: str) -> Ran:
    """Only what ``parser`` makes of ``args``: exit 0 when it accepts them. Nothing runs, so a
    bad value argparse lets through does not start a benchmark (or write its report)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(list(args))
        except SystemExit as exc:
            return Ran(exc.code if isinstance(exc.code, int) else 1, "", err.getvalue())
    return Ran(0, "", err.getvalue())


def bench_parser(benchmark: str) -> argparse.ArgumentParser:
    """The parser `llm-gateway bench BENCHMARK` builds (bench/cli.py)."""
    from bench.cli import BENCHMARKS

    module = importlib.import_module(BENCHMARKS[benchmark][0])
    parser = argparse.ArgumentParser(prog=f"llm-gateway bench {benchmark}")
    add_arguments: Callable[[argparse.ArgumentParser], None] = module.add_arguments
    add_arguments(parser)
    return parser


def in_process(main: Callable[[list[str]], int], *args: str) -> Ran:
    """``main(args)`` here, its output captured: for commands whose refusal comes before any
    work, and whose old behaviour (a traceback) fails the test rather than runs."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return Ran(code, out.getvalue(), err.getvalue())
