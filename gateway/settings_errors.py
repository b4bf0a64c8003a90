"""Settings at start-up: one clear line per mistake instead of a traceback, exit code 2."""

from __future__ import annotations

import difflib
import os
import re
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
        settings = Settings(**overrides)
    except ValidationError as exc:
        for line in describe(exc, flags):
            print(line, file=sys.stderr)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
    else:
        for line in unknown_variables(os.environ):
            print(line, file=sys.stderr)
        return settings
    return None


_NOT_OURS = re.compile(r"GATEWAY_(SERVICE_\w+|PORT_\d+_\w+|PUBLISH)")
"""GATEWAY_* variables that are not settings: Kubernetes' service links of a Service named
`gateway` (its GATEWAY_PORT is a URL, read as unset), docker-compose.yml's GATEWAY_PUBLISH."""


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning per GATEWAY_* variable that is no setting (a typo, GATEWAY_RETRYS: it would
    be ignored without a word), with the setting it most resembles."""
    known = [variable(field) for field in Settings.model_fields]
    lines = []
    for name in sorted(environ):
        if name.startswith("GATEWAY_") and name not in known and not _NOT_OURS.fullmatch(name):
            like = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {like[0]}?)" if like else ""
            lines.append(f"warning: {name} is not a setting{hint}: ignored")
    return lines
