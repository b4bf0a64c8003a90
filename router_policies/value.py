"""Immutable values that are cheap to build: frozen for the type checker, plain slots at run time.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``: about 1.2 us
for eight fields against 0.25 us for a plain slotted one (Python 3.11). The values built for
every request (its features, each candidate, the decision, the estimates) paid that on every
request. ``@value`` keeps what ``frozen=True`` gives a reader: mypy refuses any assignment to a
field, and equality and hashing are by fields, as a frozen dataclass's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def value(cls: type[_T]) -> type[_T]:
    """``@dataclass(frozen=True, slots=True)`` as mypy sees it; unfrozen when it runs."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
