"""Settings at start-up: one clear line per mistake instead of a traceback, exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from gateway.settings import Settings, variable
from router_policies.yaml_locations import message

_SECRET_FIELDS = frozenset({"admin_token", "redis_url"})


def describe(exc: ValidationError, flags: Mapping[str, str] | None = None) -> list[str]:
    """One line per mistake, naming where it was made: the variable, or the flag that gave the
    field (``flags``: field -> flag; a flag overrides the variable)."""
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        name = variable(field) if field else "settings"
        if flags and field in flags:
            name = flags[field]
        value = "" if field in _SECRET_FIELDS else f" (got {error['input']!r})"
        if not field:
            value = ""
        lines.append(f"error: {name}: {message(error)}{value}")
    return lines


def load_settings(
    overrides: dict[str, Any], flags: Mapping[str, str] | None = None
) -> Settings | None:
    """The settings, ``overrides`` (the command line's; ``flags``: the flag that gave each)
    over GATEWAY_*, or None after printing each mistake to stderr."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        for line in describe(exc, flags):
            print(line, file=sys.stderr)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return None
