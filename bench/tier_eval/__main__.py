"""``python -m bench.tier_eval``: the same as ``llm-gateway bench tiers``."""

from __future__ import annotations

import argparse
import sys

from bench.tier_eval import __doc__ as description
from bench.tier_eval.cli import add_arguments, run

parser = argparse.ArgumentParser(
    prog="python -m bench.tier_eval", description=(description or "").splitlines()[0]
)
add_arguments(parser)
sys.exit(run(parser.parse_args()))
