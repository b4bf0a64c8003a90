"""Settings at start-up: one clear line per mistake instead of a traceback, exit code 2."""

from __future__ import annotations

import sys
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from gateway.settings import Settings

_SECRET_FIELDS = frozenset({"admin_token", "redis_url"})


def describe(exc: ValidationError) -> list[str]:
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        name = f"GATEWAY_{field.upper()}" if field else "settings"
        value = "" if field in _SECRET_FIELDS else f" (got {error['input']!r})"
        if not field:
            value = ""
        lines.append(f"error: {name}: {error['msg']}{value}")
    return lines


def load_settings(overrides: dict[str, Any]) -> Settings | None:
    """The settings, or None after printing each mistake to stderr."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        for line in describe(exc):
            print(line, file=sys.stderr)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return None
