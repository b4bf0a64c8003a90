"""``python -m replica.sim``: the simulated replica without the gateway's CLI."""

import argparse
import sys

from replica.sim.cli import run
from replica.sim.config import add_arguments


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m replica.sim", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
