"""The live policy generation, and swapping it: from a file watch, SIGHUP or the admin API.

A reload builds a new Fleet from the new policy and the old one (replica state, prefix indexes
and calibration carry over), then swaps one reference. Requests already routed keep the pool
objects they hold, so they finish under the policy they started with. An invalid file changes
nothing. The `state:` section is the exception: the shared-state backend is built once at
start-up, so a changed one is reported (a restart applies it) and the current one is kept.
Each reload (the file watch, SIGHUP, the admin API) reads and validates the file in a thread,
off the event loop, one reload at a time: a later one reads the file after an earlier one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.fleet.pools import Fleet
from gateway.policy.check import PolicyFile, checked, read_policy_file
from router_policies.schema import InvalidPolicy, Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReloadResult:
    ok: bool
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    """What the reload could not apply live, though the file is valid."""


STATE_NEEDS_RESTART = (
    "state: the section changed, but the shared-state backend is set up at start-up only: "
    "restart the gateway to apply it (until then the current one stays)"
)
KEYS_NO_LONGER_CHECKED = (
    "limits: the new policy has no tenants, so API keys are no longer checked: every caller "
    "is served without a key"
)


def _read(path: Path) -> PolicyFile | tuple[str, ...]:
    """The file read and validated, or why it cannot be used. Shares nothing with the loop."""
    try:
        return read_policy_file(path)
    except OSError as exc:
        return (f"cannot read {path}: {exc.strerror}",)
    except UnicodeDecodeError as exc:
        return (f"{path} is not UTF-8 text (byte {exc.start})",)
    except InvalidPolicy as exc:
        return tuple(exc.problems)
    except Exception as exc:
        # Whatever a file can do to the parser, the current policy stays (see _swap).
        log.exception("policy reload failed unexpectedly")
        return (f"unexpected error: {type(exc).__name__}: {exc}",)


Stamp = tuple[int, int, int]
"""A policy file's identity on disk: modification time, size, inode."""


def file_stamp(path: Path) -> Stamp | None:
    """The file's stamp now; None where it cannot be read."""
    # Following the symlink: a Kubernetes ConfigMap update swaps the ..data link underneath.
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class PolicyHolder:
    def __init__(
        self,
        policy: Policy,
        path: Path | None,
        record: Callable[[bool], None],
        refuse: Callable[[Policy], str | None] = lambda _: None,
    ) -> None:
        """``record``: told each reload's outcome (applied or not); ``refuse``: why this process
        cannot run a policy that is valid on its own (one line), or None; such a reload fails
        like an invalid file."""
        self.fleet = Fleet(policy)
        self.path = path
        self._record = record
        self._refuse = refuse
        self._stamp = file_stamp(path) if path is not None else None
        """The file as it stood when last read, whether its policy applied or not."""
        self._polled = self._stamp
        self._applied = self._stamp
        """The file as it stood when the policy in force was read from it."""
        self._one_at_a_time = asyncio.Lock()
        self._reloading: set[asyncio.Task[ReloadResult]] = set()

    async def reload(self) -> ReloadResult:
        """Reads, parses and validates the file in a thread, then swaps it in on the loop: the
        parse takes the loop's time (about 0.3 ms a pool), in which no request, /health
        included, would be answered. The rest runs on the loop: the tier models load through a
        cache the fleet uses unlocked, and the new Fleet is built from the live one."""
        path = self.path
        if path is None:
            return ReloadResult(False, ("the gateway was started without a policy file",))
        async with self._one_at_a_time:
            # Stamped before the read: an edit made during the read is seen by the next poll.
            stamp = self._stamp = file_stamp(path)
            result = self._swap(await asyncio.to_thread(_read, path))
            if result.ok:
                self._applied = stamp
            return result

    def _swap(self, read: PolicyFile | tuple[str, ...]) -> ReloadResult:
        if isinstance(read, tuple):
            return self._failed(read)
        warnings: tuple[str, ...] = ()
        try:
            policy = checked(read)
            current = self.fleet.policy.state
            if policy.state != current:
                warnings = (STATE_NEEDS_RESTART,)
                # /admin/policy then shows the section in effect, not the one waiting.
                policy = policy.model_copy(update={"state": current})
            if self.fleet.policy.limits.tenants and not policy.limits.tenants:
                warnings += (KEYS_NO_LONGER_CHECKED,)
            refused = self._refuse(policy)
            if refused is not None:
                return self._failed((refused,))
            fleet = Fleet(policy, previous=self.fleet)
        except InvalidPolicy as exc:
            return self._failed(tuple(exc.problems))
        except Exception as exc:
            # Whatever a file can do to the loader, the current policy stays and the watch
            # goes on: a reload must never take the process's configuration down with it.
            log.exception("policy reload failed unexpectedly")
            return self._failed((f"unexpected error: {type(exc).__name__}: {exc}",))
        self.fleet = fleet
        self._record(True)
        log.info("policy reloaded from %s", self.path)
        for warning in warnings:
            log.warning("policy reload: %s", warning)
        return ReloadResult(True, warnings=warnings)

    def _failed(self, problems: tuple[str, ...]) -> ReloadResult:
        self._record(False)
        log.error("policy reload failed, the current policy stays: %s", "; ".join(problems))
        return ReloadResult(False, problems)

    def reload_soon(self) -> None:
        """SIGHUP's reload: a task, held until it ends (the loop keeps only weak references)."""
        task = asyncio.get_running_loop().create_task(self.reload())
        self._reloading.add(task)
        task.add_done_callback(self._reloading.discard)

    @property
    def read_at(self) -> Stamp | None:
        """The file's stamp when the policy in force was read from it: a file that failed to
        load since is not it."""
        return self._applied

    def read_when(self, stamp: Stamp | None) -> None:
        """Says the policy in force was read from the file as it stood at ``stamp``, not as it
        stands now (a replacement worker starts with its parent's policy): a file changed
        since, one that failed to load in the parent included, is read again once it settles,
        and says for itself whether it loads."""
        self._stamp = self._polled = self._applied = stamp

    def changed_on_disk(self) -> bool:
        return self.path is not None and file_stamp(self.path) != self._stamp

    def settled_change(self) -> bool:
        """The file changed since it was last read and has stood as it is since the last poll:
        a file written in place in several writes (an editor saving, a copy) is read once
        whole, not as the prefix on disk between two writes, which may parse (a policy cut
        before its `limits:` would serve every caller without a key)."""
        stamp = file_stamp(self.path) if self.path is not None else None
        polled, self._polled = self._polled, stamp
        return stamp != self._stamp and stamp == polled

    async def watch(self, interval_s: float) -> None:
        """Polls the file: portable, and immune to the inotify pitfalls of symlink swaps."""
        while True:
            await asyncio.sleep(interval_s)
            if self.settled_change():
                await self.reload()
