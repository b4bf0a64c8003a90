"""What the host says about itself: the machine, and a process tree's CPU time from /proc."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine_description() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = (line.split(":", 1)[1] for line in cpuinfo if line.startswith("model name"))
            model = next(names, "").strip()
    except OSError:
        pass  # not Linux: the core count and platform still say enough
    cores = os.cpu_count() or 0
    cpu = f"{cores} cores" + (f" ({model})" if model else "")
    return f"{cpu}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def rss_mib(pid: int) -> float:
    """The process's resident memory (VmRSS), in MiB; NaN where /proc does not say."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def children(pid: int) -> list[int]:
    """The process's children (those its main thread started: a gateway's forked workers)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _descendants(pid: int) -> list[int]:
    found = [pid]
    for parent in found:  # grows while iterated: a breadth-first walk of the process tree
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                found += [int(child) for child in children.read_text().split()]
            except OSError:
                continue  # the thread ended while being read
    return found


def process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds run so far by every live thread of ``pid`` and its descendants, at
    nanosecond resolution (``utime`` in /proc/PID/stat counts 10 ms ticks, too coarse for a
    batch of a few hundred requests). None where /proc has no schedstat (not Linux).

    The time of a thread that exited between two readings is lost: the routers measured here
    keep their worker threads for the whole run.
    """
    if pid is None:
        return None
    total_ns = 0
    seen = False
    for process in _descendants(pid):
        for schedstat in Path(f"/proc/{process}/task").glob("*/schedstat"):
            try:
                total_ns += int(schedstat.read_text().split()[0])
                seen = True
            except (OSError, ValueError, IndexError):
                continue
    return total_ns / 1e9 if seen else None
