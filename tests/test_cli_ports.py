"""Every port flag of `llm-gateway`: a port out of range is refused while parsing, a port 0
asks for any free one and the log says which, and a port in use is one `error:` line before
anything starts (no probe warnings, no log-formatted error, no gRPC C-core line)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.cli import build_parser, main
from replica.processes import free_port
from tests.command_line import (
    EXAMPLE_POLICY,
    Ran,
    in_process,
    llm_gateway_process,
    logged_port,
    parsed,
    taken_port,
)

POLICY = str(EXAMPLE_POLICY)
QUIET = {"GATEWAY_HEALTH_TIMEOUT_S": "0.2"}
"""The example policy's replicas are not there: their probes give up soon."""


@pytest.mark.parametrize(
    ("args", "flag", "bad"),
    [
        (["serve", "--port", "-1"], "--port", "-1"),
        (["serve", "--port", "65536"], "--port", "65536"),
        (["epp", "--port", "-5"], "--port", "-5"),
        (["epp", "--port", "70000"], "--port", "70000"),
        (["epp", "--http-port", "-1"], "--http-port", "-1"),
        (["envoy-config", "--listen-port", "-1", "--picker-port", "9002"], "--listen-port", "-1"),
        (["envoy-config", "--listen-port", "0", "--picker-port", "9002"], "--listen-port", "0"),
        (["envoy-config", "--listen-port", "80", "--picker-port", "99999"], "--picker-port", "99999"),
        (["envoy-config", "--listen-port", "80", "--picker-port", "0"], "--picker-port", "0"),
        (["envoy-config", "--listen-port", "80", "--picker-port", "9002", "--admin-port", "0"],
         "--admin-port", "0"),
        (["sim-replica", "--port", "-1"], "--port", "-1"),
        (["sim-replica", "--port", "70000"], "--port", "70000"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)  # fmt: skip
def test_a_port_out_of_range_is_refused_while_parsing(args: list[str], flag: str, bad: str) -> None:
    ran = parsed(build_parser(), *args)
    assert ran.refused(), ran.err
    assert one_line(ran).startswith(f"error: {flag}: a port is 1 to 65535"), ran.err
    assert one_line(ran).endswith(f"not {bad}")


def test_envoy_config_writes_no_config_with_bad_ports() -> None:
    ran = in_process(
        main, "envoy-config", "--listen-port", "-1", "--picker-port", "99999",
        "--admin-port", "0", "--policy", POLICY,
    )  # fmt: skip
    assert ran.refused("--listen-port"), ran.err
    assert ran.out == ""


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process (this one) listens on."""
    with taken_port() as port:
        yield port


def one_line(ran: Ran) -> str:
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1, ran.err
    return lines[0]


def test_serve_on_a_port_in_use_is_one_line_before_the_probes(taken: int) -> None:
    ran = llm_gateway_process("serve", "--policy", POLICY, "--port", str(taken), env=QUIET)
    assert ran.refused(), ran.err
    assert one_line(ran) == (
        f"error: --port: cannot listen on 127.0.0.1:{taken}: address already in use"
    )


def test_serve_on_a_gateway_port_in_use_names_the_variable(taken: int) -> None:
    env = {**QUIET, "GATEWAY_PORT": str(taken)}
    ran = llm_gateway_process("serve", "--policy", POLICY, env=env)
    assert one_line(ran).startswith("error: GATEWAY_PORT: cannot listen on"), ran.err
    assert ran.code == 2


@pytest.mark.parametrize("flag", ["--port", "--http-port"])
def test_epp_on_a_port_in_use_is_one_line(taken: int, flag: str) -> None:
    ports = {"--port": str(free_port()), "--http-port": str(free_port()), flag: str(taken)}
    args = [arg for pair in ports.items() for arg in pair]
    ran = llm_gateway_process("epp", "--policy", POLICY, *args, env=QUIET)
    assert ran.refused(), ran.err
    assert (
        one_line(ran)
        == f"error: {flag}: cannot listen on 127.0.0.1:{taken}: address already in use"
    )


@pytest.mark.parametrize(
    ("ports", "named"),
    [
        (["--listen-port", "8000", "--picker-port", "8000"], "--listen-port and --picker-port"),
        (
            ["--listen-port", "8000", "--picker-port", "9002", "--admin-port", "9002"],
            "--picker-port and --admin-port",
        ),
    ],
)
def test_envoy_config_refuses_one_port_for_two_of_its_parts(ports: list[str], named: str) -> None:
    ran = llm_gateway_process("envoy-config", *ports, "--policy", POLICY)
    assert one_line(ran) == f"error: {named} name one port: each needs its own"
    assert ran.code == 2 and ran.out == ""


def test_a_host_that_cannot_be_listened_on_names_its_setting() -> None:
    env = {**QUIET, "GATEWAY_HOST": "192.0.2.1"}
    ran = llm_gateway_process("serve", "--policy", POLICY, "--port", str(free_port()), env=env)
    assert one_line(ran).startswith("error: --host (GATEWAY_HOST): cannot listen on 192.0.2.1:")
    assert ran.code == 2


def test_epp_refuses_one_port_for_both_its_servers() -> None:
    port = str(free_port())
    ran = llm_gateway_process("epp", "--policy", POLICY, "--port", port, "--http-port", port)
    assert one_line(ran) == f"error: --port: {port} is the HTTP port too (--http-port)"
    assert ran.code == 2


def test_epp_on_port_0_logs_the_picker_port_it_took() -> None:
    args = ["epp", "--policy", POLICY, "--port", "0", "--http-port", "0"]
    port = logged_port(args, "endpoint picker", r"listening on 127\.0\.0\.1:(\d+)")
    assert port != 0
