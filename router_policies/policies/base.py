"""The one interface every replica-selection policy implements, with no-op hooks by default.

A policy is made per pool (``make``) and may keep state of its own (the prefix policy keeps its
index of what each replica holds). ``select`` is the pure decision: no I/O, no mutation.
The policy computes the request's features itself (``features``: the fingerprint, with its own
settings), and ``needs`` declares what the caller must gather for it, so a simple policy pays
for nothing it does not read (round-robin: no hashing, no load figures).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import ClassVar

from router_policies.decision import Decision, PoolSnapshot
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures, fingerprint, load_only
from router_policies.prefix_index import Recorded
from router_policies.prefix_settings import PrefixSettings


class Need(StrEnum):
    LOAD = "load"
    """Each candidate's in-flight count, pending prefill and scraped engine figures."""
    RATES = "rates"
    """Each candidate's learned speed."""


class SelectionPolicy:
    needs: ClassVar[frozenset[Need]] = frozenset()
    prefix: PrefixSettings | None = None
    """Fingerprint settings, for a policy that reads the prompt; None: it reads nothing of it."""

    def features(
        self, model: str, prompt: Callable[[], CanonicalPrompt], salt: str = ""
    ) -> RequestFeatures:
        """What the policy reads of a request, computed once before any decision. ``prompt``
        builds the canonical text only when called: a policy that reads none pays nothing."""
        if self.prefix is None:
            return load_only(model)
        return fingerprint(model, prompt(), self.prefix.layout, self.prefix.max_blocks, salt)

    def select(
        self, request: RequestFeatures, snapshot: PoolSnapshot, *, explain: bool = False
    ) -> Decision | None:
        """Choose a replica, or None when the snapshot has no candidate. With ``explain``,
        the decision also carries what each candidate was judged on (for operators)."""
        raise NotImplementedError

    def record(self, request: RequestFeatures, decision: Decision, now: float) -> Recorded | None:
        """Called once the request is dispatched where ``decision`` says. Returns what
        ``refused`` needs to take the record back (None: the policy keeps no index)."""
        return None

    def refused(self, replica: str, request: RequestFeatures, recorded: Recorded) -> None:
        """The replica refused the request (a 4xx) before prefilling it: it stored none of
        the prompt, and is no longer believed to hold it."""

    def estimated_cached_bytes(self, replica: str, request: RequestFeatures) -> int:
        """Bytes of the request's prompt the policy's own index says the replica holds."""
        return 0

    def size_index(self, replica: str, blocks: int) -> None:
        """The replica's KV cache holds about ``blocks`` fingerprint blocks."""

    def forget(self, replica: str) -> None:
        """The replica left the pool: what the policy knew of its cache goes with it, so the
        same address added back later (a new process, an empty cache) starts cold."""

    def index_blocks(self, replica: str) -> int:
        """Capacity of the policy's index for the replica (0 when it keeps none)."""
        return 0
