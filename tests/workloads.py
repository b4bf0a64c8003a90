"""Helpers of the benchmark-workload tests (tests/test_workloads*.py): how far two prompts'
texts agree, which is what a prefix cache can reuse of one for the other."""

from __future__ import annotations


def common_prefix(a: str, b: str) -> int:
    """The length of the longest prefix that ``a`` and ``b`` share, in characters."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
