"""`llm-gateway sim-replica`'s command line: a bad value is one `error:` line and exit 2, never a
traceback, and a replica told to take any free port says which one it took."""

from __future__ import annotations

import pytest

from tests.command_line import llm_gateway_process, logged_port, taken_port


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--port", "-1"], "--port"),
        (["--port", "70000"], "--port"),
        (["--port", "http"], "--port"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--num-blocks", "0"], "--num-blocks"),
        (["--block-size", "0"], "--block-size"),
        (["--chars-per-token", "0"], "--chars-per-token"),
        (["--model", ""], "--model"),
        (["--decode-step-s", "inf"], "--decode-step-s"),
        (["--prefill-s-per-token", "nan"], "--prefill-s-per-token"),
        (["--kv-offload-block-size", "17"], "--kv-offload-block-size"),
        (["--kv-events-config", "{bad"], "--kv-events-config"),
        (["--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "kafka"}'],
         "--kv-events-config"),
        (["--lora-modules", "="], "--lora-modules"),
        (["--lora-modules", "a=/p,=/q"], "--lora-modules"),
        (["--lora-modules", "a="], "--lora-modules"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_naming_the_flag(args: list[str], flag: str) -> None:
    # Port 0: a replica that wrongly accepted its arguments serves on a free port until killed.
    ran = llm_gateway_process("sim-replica", "--port", "0", *args, timeout_s=15)
    assert ran.refused(), ran.err
    [line] = ran.err.strip().splitlines()
    assert line.startswith(f"error: {flag}: "), ran.err


def test_a_port_in_use_is_one_line() -> None:
    with taken_port() as port:
        ran = llm_gateway_process("sim-replica", "--port", str(port), timeout_s=15)
    # The words replica/processes.py looks for, to start it again on another port.
    assert ran.refused("--port", f"127.0.0.1:{port}", "address already in use"), ran.err
    assert len(ran.err.strip().splitlines()) == 1, ran.err


def test_port_0_logs_the_port_the_replica_took() -> None:
    port = logged_port(["sim-replica", "--port", "0"], "sim replica", r"http://127\.0\.0\.1:(\d+)")
    assert port != 0
