"""The `llm-gateway` command line (CONTRACT): serve, sim-replica, check-policy, and the tools.

The product's commands are defined here. The tooling's (`demo`, `bench`) are plugins found by
entry point (group ``llm_gateway.tools``, declared in pyproject.toml), so the gateway never
imports its tooling, and an install without it (the production image) says so in one line.
A command's module is imported only when that command runs.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from gateway.cli_types import listen_port, port
from router_policies.schema import InvalidPolicy, Policy, effective_policy_yaml

if TYPE_CHECKING:
    from gateway.policy.reload import Stamp
    from gateway.settings import Settings

TOOLS_GROUP = "llm_gateway.tools"
_TOOL_HELP = {
    "demo": "simulated fleet + gateway on loopback: prefix-aware vs round-robin",
    "bench": "benchmarks (needs the bench extra: pip install 'llm-gateway[bench]')",
    "tiers": "train and evaluate the learned tier classifier (needs the bench extra)",
}


def _process_config(
    flags: Sequence[tuple[str, str, object]],
) -> tuple[Settings, Policy, Stamp | None] | None:
    """What `serve` and `epp` run with: the settings (``flags``, each a field, the flag that
    sets it and its value, over GATEWAY_*), logging configured, the policy checked and the
    file's stamp from before it was read (an edit made since is read again once the gateway
    runs); None (and the reason on stderr) when unusable."""
    # SIGHUP asks a running gateway to reload its policy. Until its event loop takes the signal
    # (once it listens) the default would end the process: ignored meanwhile, as the policy
    # file watch picks up an edit made then.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from gateway.settings_errors import load_settings
    from gateway.telemetry.logs import configure

    given = [(field, flag, value) for field, flag, value in flags if value is not None]
    settings = load_settings(
        {field: value for field, _, value in given}, {field: flag for field, flag, _ in given}
    )
    if settings is None:
        return None
    configure(settings.log_level)
    if settings.policy is None:
        print("error: no policy file: pass --policy PATH or set GATEWAY_POLICY", file=sys.stderr)
        return None
    from gateway.policy.reload import file_stamp

    read_at = file_stamp(settings.policy)
    policy = _load_or_explain(settings.policy)
    if policy is None or not _state_usable(settings, policy):
        return None
    return settings, policy, read_at


def _serve(args: argparse.Namespace) -> int:
    config = _process_config(
        [("host", "--host", args.host), ("port", "--port", args.port),
         ("policy", "--policy", args.policy), ("workers", "--workers", args.workers)]
    )  # fmt: skip
    if config is None:
        return 2
    settings, policy, read_at = config
    if not _listenable(settings.host, settings.port, "--port" if args.port is not None else None):
        return 2
    from gateway.server import run

    return run(settings, policy, read_at=read_at)


def _epp(args: argparse.Namespace) -> int:
    config = _process_config(
        [
            ("host", "--host", args.host),
            ("port", "--http-port", args.http_port),
            ("policy", "--policy", args.policy),
        ]
    )
    if config is None:
        return 2
    settings, policy, read_at = config
    if settings.workers > 1:
        # Workers are forked by `serve` alone: they would run without the picker's gRPC
        # server, and Envoy would find no picker.
        print("error: GATEWAY_WORKERS: llm-gateway epp runs one process; unset it", file=sys.stderr)
        return 2
    http_flag = "--http-port" if args.http_port is not None else None
    if args.port == settings.port != 0:  # the second bind would fail after the probes started
        print(f"error: --port: {args.port} is the HTTP port too ({http_flag or 'GATEWAY_PORT'})",
              file=sys.stderr)  # fmt: skip
        return 2
    if not (
        _listenable(settings.host, settings.port, http_flag)
        and _listenable(settings.host, args.port, "--port")
    ):
        return 2
    from gateway.picker.server import add_picker  # here, so that `serve` never loads gRPC
    from gateway.server import run

    return run(
        settings, policy, lambda app: add_picker(app, settings.host, args.port), read_at=read_at
    )


def _listenable(host: str, port: int, flag: str | None) -> bool:
    """Whether ``port`` can be had (``flag`` gave it, or else GATEWAY_PORT), checked before the
    fleet's probes start: their warnings would come before the one line that matters, and for
    the picker's port gRPC's C core would log its own line first. A process that takes the port
    in the instant between is still refused by the bind itself, later."""
    if port == 0:
        return True
    from gateway.server import port_taken

    problem = port_taken(host, port)
    if problem is None:
        return True
    where = f"{host}:{port}"
    if problem.errno == errno.EADDRINUSE:
        # "address already in use": what replica/processes.py looks for to pick another port.
        name = flag or "GATEWAY_PORT"
        print(f"error: {name}: cannot listen on {where}: address already in use", file=sys.stderr)
    else:  # a host that does not resolve, or is not this machine's
        why = problem.strerror or problem
        print(f"error: --host (GATEWAY_HOST): cannot listen on {where}: {why}", file=sys.stderr)
    return False


def _envoy_config(args: argparse.Namespace) -> int:
    import yaml

    from gateway.picker.envoy_config import bootstrap
    from gateway.settings_errors import load_settings

    ports = [args.listen_port, args.picker_port, args.admin_port]
    flags = ("--listen-port", "--picker-port", "--admin-port")
    shared = [f for f, port in zip(flags, ports, strict=True) if port and ports.count(port) > 1]
    if shared:  # Envoy would not bind, or would send the picker's traffic to its own listener
        print(f"error: {' and '.join(shared)} name one port: each needs its own", file=sys.stderr)
        return 2
    settings = load_settings({"policy": args.policy} if args.policy else {})
    if settings is None:
        return 2
    if settings.policy is None:
        print("error: no policy file: pass --policy PATH or set GATEWAY_POLICY", file=sys.stderr)
        return 2
    policy = _load_or_explain(settings.policy)
    if policy is None:
        return 2
    queue_s = max(pool.queue_timeout_s for pool in policy.pools.values())
    config = bootstrap(
        policy,
        listen_port=args.listen_port,
        picker_port=args.picker_port,
        admin_port=args.admin_port,
        fail_open=not args.fail_closed,
        # Each answer of the picker may wait in a pool's admission queue.
        message_timeout_s=queue_s + 5,
        max_body_bytes=settings.max_body_bytes,
    )
    sys.stdout.write(yaml.safe_dump(config, sort_keys=False))
    return 0


def _check_policy(args: argparse.Namespace) -> int:
    from gateway.settings_errors import load_settings

    if not args.path.strip():
        # As a Path, "" is the current directory: "cannot read policy file .: Is a directory".
        print("error: the policy file path is empty", file=sys.stderr)
        return 2
    policy = _load_or_explain(Path(args.path))
    if policy is None:
        return 2
    # With the environment `serve` would see: GATEWAY_REDIS_URL can supply the URL a
    # `state: {backend: redis}` section leaves out, and per-key limits under GATEWAY_WORKERS
    # need Redis.
    settings = load_settings({})
    if settings is None or not _state_usable(settings, policy):
        return 2
    sys.stdout.write(effective_policy_yaml(policy))
    if settings.redis_url is not None:
        print("note: GATEWAY_REDIS_URL is set: it overrides the state section", file=sys.stderr)
    return 0


def _state_usable(settings: Settings, policy: Policy) -> bool:
    from gateway.state_backend import startup_problem

    problem = startup_problem(settings, policy)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
    return problem is None


def _load_or_explain(path: Path) -> Policy | None:
    from gateway.policy.check import load_checked_policy

    try:
        return load_checked_policy(path)
    except OSError as exc:
        print(f"error: cannot read policy file {path}: {exc.strerror}", file=sys.stderr)
    except UnicodeDecodeError as exc:
        print(f"error: {path} is not UTF-8 text (byte {exc.start})", file=sys.stderr)
    except InvalidPolicy as exc:
        print(f"error: {path} is not a valid policy:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
    return None


def _hash_key(args: argparse.Namespace) -> int:
    """Prints the sha256 digest a policy's limits.tenants.*.api_key_sha256 lists. The key is
    read from stdin (or a hidden prompt), never from argv: argv shows in `ps` and in shell
    history."""
    from gateway.rate_limit.keys import hash_key

    if sys.stdin.isatty():
        import getpass

        try:
            key = getpass.getpass("API key (not echoed): ")
        except EOFError:  # Ctrl-D at the prompt: no key, as an empty line
            key = ""
    else:
        key = sys.stdin.readline()
    key = key.strip()
    if not key:
        print("error: no key on stdin", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


def _key_as_argument(args: Sequence[str]) -> bool:
    """Refuses `hash-key` with an argument, which may be the key, without printing it: argparse
    would answer "unrecognized arguments: <the key>" (in the terminal, and in any log of it)."""
    if args[:1] != ["hash-key"] or all(arg in ("-h", "--help") for arg in args[1:]):
        return False
    print(
        "error: hash-key takes no argument: it reads the key from stdin, so that the key is "
        'not in `ps` or the shell\'s history (printf %s "$KEY" | llm-gateway hash-key); '
        "what was given is not shown",
        file=sys.stderr,
    )
    return True


def _sim_replica(args: argparse.Namespace) -> int:
    from replica.sim.cli import run

    return run(args)


def _tools() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=TOOLS_GROUP)}


def _run_tool(entry: EntryPoint, argv: Sequence[str]) -> int:
    try:
        main: Callable[[Sequence[str]], int] = entry.load()
    except ModuleNotFoundError as exc:
        print(
            f"error: `llm-gateway {entry.name}` is tooling that this install lacks "
            f"({exc.name} is missing; the production image holds only the gateway): "
            "pip install 'llm-gateway[bench]'",
            file=sys.stderr,
        )
        return 2
    return main(argv)


class _Parser(argparse.ArgumentParser):
    """Refuses a bad argument in one line, `error: --port: ...`, as every other mistake at
    start-up is refused (a setting, the policy, a port in use), exit status 2. Its subcommands'
    parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        if not message.startswith("argument "):  # an argument missing or unknown: show them all
            self.print_usage(sys.stderr)
        self.exit(2, f"error: {message.removeprefix('argument ')}\n")


def build_parser(tools: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="llm-gateway", description="OpenAI-compatible routing gateway for vLLM pools."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument(
        "--policy", type=Path, help="routing policy YAML file (default from GATEWAY_POLICY)"
    )
    serve.add_argument("--host", help="bind address (default from GATEWAY_HOST: 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=listen_port,
        help="port, 0 for any free one (default from GATEWAY_PORT: 8080)",
    )
    serve.add_argument(
        "--workers",
        help="processes serving the port (SO_REUSEPORT; default from GATEWAY_WORKERS: 1), or "
        "'auto' for one per usable CPU; they share routing state through Redis when one is "
        "configured, else with each other over Unix sockets",
    )
    serve.set_defaults(func=_serve)

    epp = sub.add_parser("epp", help="run the endpoint picker for Envoy (ext_proc)")
    epp.add_argument(
        "--policy", type=Path, help="routing policy YAML file (default from GATEWAY_POLICY)"
    )
    epp.add_argument("--host", help="bind address (default from GATEWAY_HOST: 127.0.0.1)")
    epp.add_argument(
        "--port", type=listen_port, default=9002, help="the picker's gRPC port (9002; 0: any free)"
    )
    epp.add_argument(
        "--http-port",
        type=listen_port,
        help="/metrics, /health, /ready and the admin API (default from GATEWAY_PORT: 8080)",
    )
    epp.set_defaults(func=_epp)

    envoy = sub.add_parser(
        "envoy-config", help="print an Envoy bootstrap that asks the picker (llm-gateway epp)"
    )
    envoy.add_argument("--listen-port", type=port, required=True, help="Envoy's port for clients")
    envoy.add_argument("--picker-port", type=port, required=True, help="the picker's gRPC port")
    envoy.add_argument(
        "--policy", type=Path, help="the picker's policy, for the replicas (GATEWAY_POLICY)"
    )
    envoy.add_argument("--admin-port", type=port, help="Envoy's admin port (none by default)")
    envoy.add_argument(
        "--fail-closed",
        action="store_true",
        help="answer 500 while the picker is unreachable (default: Envoy's least-request)",
    )
    envoy.set_defaults(func=_envoy_config)

    check = sub.add_parser("check-policy", help="validate a policy file, print it with defaults")
    check.add_argument("path", help="the policy YAML file")
    check.set_defaults(func=_check_policy)

    hash_help = "print the sha256 of an API key read from stdin, for limits.tenants"
    hashed = sub.add_parser("hash-key", help=hash_help, description=hash_help)
    hashed.set_defaults(func=_hash_key)

    from replica.sim.config import add_arguments as add_sim_arguments

    sim = sub.add_parser("sim-replica", help="run one simulated vLLM replica")
    add_sim_arguments(sim, types={"port": listen_port})
    sim.set_defaults(func=_sim_replica)

    for name in tools:
        # Listed for --help only: main() hands a tool's arguments to the tool itself.
        sub.add_parser(name, help=_TOOL_HELP.get(name, "tooling"), add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if _key_as_argument(args_list):
        return 2
    tools = _tools()
    if args_list and args_list[0] in tools:
        return _run_tool(tools[args_list[0]], args_list[1:])
    args = build_parser(sorted(tools)).parse_args(args_list)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
