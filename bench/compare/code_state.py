"""Which code a comparison measured: the git revision and a hash of the sources."""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


MEASURED_PATHS = ("gateway", "router_policies", "replica", "bench")
"""The code a comparison runs: its report names the git revision and a hash of these."""


def source_digest() -> str:
    """A hash of every .py file under MEASURED_PATHS: equal digests, equal code measured,
    whatever was committed in between."""
    digest = hashlib.sha256()
    for path in sorted(p for top in MEASURED_PATHS for p in (ROOT / top).rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def code_revision() -> str:
    """The git revision the run used, and which measured paths differed from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *MEASURED_PATHS],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except OSError:
        return "unknown (no git)"
    changed = sorted({line[3:].strip() for line in dirty if line.strip()})
    if not head:
        return "unknown (not a git checkout)"
    return f"git {head}" + (
        f", plus uncommitted changes to {', '.join(changed)}" if changed else ""
    )


@dataclass(frozen=True, slots=True)
class CodeState:
    revision: str
    digest: str

    @classmethod
    def now(cls) -> CodeState:
        return cls(code_revision(), source_digest())


def code_line(at_start: CodeState, at_end: CodeState) -> str:
    """The report's Code line: the revision at the start, and whether the code changed."""
    line = f"{at_start.revision}; sources of {', '.join(MEASURED_PATHS)} hash {at_start.digest}"
    if at_end.digest != at_start.digest:
        # Someone changed the code while the benchmark ran: the figures belong to neither state.
        line += f", {at_end.digest} at the end (the code CHANGED during the run)"
    elif at_end.revision != at_start.revision:
        line += f" (unchanged at the end, committed as {at_end.revision})"
    return line
