"""RequestFeatures to and from plain JSON values, generically: by the dataclass's own fields,
so a field added to RequestFeatures travels without a change here. A receiver that does not
know a field ignores it; one that misses a field gets its default."""

from __future__ import annotations

import dataclasses
from typing import Any

from router_policies.fingerprint import RequestFeatures

FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RequestFeatures))


def encode(features: RequestFeatures) -> list[Any]:
    """The field values in FIELDS order (tuples become JSON arrays)."""
    return [getattr(features, name) for name in FIELDS]


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def decode(names: list[str], values: list[Any]) -> RequestFeatures | None:
    """The features, or None when the values cannot make one (another version's shape)."""
    known = {n: _tuples(v) for n, v in zip(names, values, strict=False) if n in FIELDS}
    try:
        return RequestFeatures(**known)
    except TypeError:
        return None
