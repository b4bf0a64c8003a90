"""The task's length as a yardstick for the tier classifiers' evaluation: in the public sets
the hard sources are the longer ones, so an AUC there says as much about the sets' styles as
about what a classifier reads. ``tiers eval`` scores every test set by length alone, and each
classifier within one length class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.tier_eval.evaluation import Example
from router_policies.tier_classifier import TierScore, task_texts


def task_length(body: Mapping[str, Any]) -> int:
    """Characters of the task, its first user message (as the classifiers read it)."""
    return len(task_texts(body)[0][0])


def length_class(example: Example) -> int:
    """The task's length to a factor of two: a hard and an easy prompt of one class differ by
    what they say more than by how much."""
    return task_length(example.body).bit_length()


class LengthAlone:
    """A yardstick, not a classifier a policy can name: longer tasks score higher. Where it
    ranks a test set well, the set's hard and easy prompts differ in length, and a classifier's
    AUC there says as much about the sets' styles as about the task."""

    name = "length alone"

    def score(self, body: Mapping[str, Any]) -> TierScore:
        length = task_length(body)
        return TierScore(length / (length + 1.0), {}, {}, self.name)
