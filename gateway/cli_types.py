"""Argument types (argparse ``type=``) of every `llm-gateway` command, the tooling's included.

A value out of range is refused while the arguments are parsed: one line naming the flag, exit
status 2, before any process starts or any report is written. The tooling (bench/) imports
these from here, as the product never imports the tooling.
"""

from __future__ import annotations

import argparse
import math

_PORTS = 65535


def port(text: str) -> int:
    """A TCP port another process listens on, or one written into a config: 1-65535."""
    value = _whole(text)
    if not 1 <= value <= _PORTS:
        raise argparse.ArgumentTypeError(f"a port is 1 to {_PORTS}, not {text}")
    return value


def listen_port(text: str) -> int:
    """A port this process listens on: 1-65535, or 0 for one the system picks (the command
    then logs the port it took)."""
    value = _whole(text)
    if not 0 <= value <= _PORTS:
        raise argparse.ArgumentTypeError(
            f"a port is 1 to {_PORTS} (or 0: any free one), not {text}"
        )
    return value


def positive_int(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def non_negative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {text}")
    return value


def positive_float(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {text}")
    return value


def share(text: str) -> float:
    """A share of a whole: 0 to 1."""
    value = _finite(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    # float() reads "nan" and "inf": a duration or a rate that is either never ends or means
    # nothing.
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value
