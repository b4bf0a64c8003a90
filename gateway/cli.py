"""The `llm-gateway` command line (CONTRACT): serve, sim-replica, demo, check-policy, bench."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.settings import Settings
from router_policies.schema import InvalidPolicy, Policy, effective_policy_yaml, load_policy


def _serve(args: argparse.Namespace) -> int:
    flags = (("host", args.host), ("port", args.port), ("policy", args.policy))
    settings = Settings(**{k: v for k, v in flags if v is not None})
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if settings.policy is None:
        print("error: no policy file: pass --policy PATH or set GATEWAY_POLICY", file=sys.stderr)
        return 2
    policy = _load_or_explain(settings.policy)
    if policy is None:
        return 2
    from gateway.server import run

    run(settings, policy)
    return 0


def _check_policy(args: argparse.Namespace) -> int:
    policy = _load_or_explain(args.path)
    if policy is None:
        return 2
    sys.stdout.write(effective_policy_yaml(policy))
    return 0


def _load_or_explain(path: Path) -> Policy | None:
    try:
        return load_policy(path)
    except OSError as exc:
        print(f"error: cannot read policy file {path}: {exc.strerror}", file=sys.stderr)
    except InvalidPolicy as exc:
        print(f"error: {path} is not a valid policy:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
    return None


def _sim_replica(args: argparse.Namespace) -> int:
    from replica.sim.cli import run

    return run(args)


def _demo(args: argparse.Namespace) -> int:
    from gateway.demo import run

    return run(args)


def _bench(args: argparse.Namespace) -> int:
    from bench.cli import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-gateway", description="OpenAI-compatible routing gateway for vLLM pools."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument(
        "--policy", type=Path, help="routing policy YAML file (default from GATEWAY_POLICY)"
    )
    serve.add_argument("--host", help="bind address (default from GATEWAY_HOST: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default from GATEWAY_PORT: 8080)")
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-policy", help="validate a policy file, print it with defaults")
    check.add_argument("path", type=Path)
    check.set_defaults(func=_check_policy)

    from replica.sim.cli import add_arguments as add_sim_arguments

    sim = sub.add_parser("sim-replica", help="run one simulated vLLM replica")
    add_sim_arguments(sim)
    sim.set_defaults(func=_sim_replica)

    from gateway.demo import add_arguments as add_demo_arguments

    demo = sub.add_parser("demo", help="simulated fleet + gateway, prefix-aware vs round-robin")
    add_demo_arguments(demo)
    demo.set_defaults(func=_demo)

    from bench.cli import add_arguments as add_bench_arguments

    bench = sub.add_parser("bench", help="benchmarks")
    add_bench_arguments(bench)
    bench.set_defaults(func=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
