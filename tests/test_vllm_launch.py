"""The vLLM launch recipe: tuned flags rendered from one place, checked by vLLM's own parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from replica import vllm_launch as launch
from replica.processes import free_port, kv_events_endpoint
from replica.vllm_cpu import fleet
from replica.vllm_cpu.tiny_model import SIZES, default_dir, has_model
from replica.vllm_launch import (
    Device,
    VllmProfile,
    cpu_dev_profile,
    cpu_dtype,
    environment,
    gpu_large_profile,
    gpu_small_profile,
    render,
)


def option(argv: list[str], flag: str) -> str | None:
    """The value after ``flag``, or None when the flag is absent."""
    return argv[argv.index(flag) + 1] if flag in argv else None


def given(argv: list[str], flag: str) -> str:
    """The value after ``flag``, which must be there."""
    value = option(argv, flag)
    assert value is not None, f"{flag} is missing"
    return value


def cpu_profile() -> VllmProfile:
    return cpu_dev_profile("/models/tiny", "tiny", port=9001, core=1, python="/venv/bin/python")


def test_gpu_small_profile_renders_the_production_flags() -> None:
    argv = render(gpu_small_profile("meta-llama/Llama-3.1-8B-Instruct", "llama-8b", port=8100))
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert option(argv, "--served-model-name") == "llama-8b"
    assert option(argv, "--host") == "0.0.0.0"
    assert option(argv, "--port") == "8100"
    assert option(argv, "--max-num-seqs") == "256"
    assert option(argv, "--max-num-batched-tokens") == "8192"
    assert option(argv, "--gpu-memory-utilization") == "0.90"
    assert "--enable-prefix-caching" in argv
    assert "--enable-chunked-prefill" in argv
    assert "--enable-prompt-tokens-details" in argv
    assert "--enforce-eager" not in argv  # CUDA graphs stay on
    assert "--tensor-parallel-size" not in argv
    assert "--quantization" not in argv
    events = json.loads(given(argv, "--kv-events-config"))
    assert events["enable_kv_cache_events"] and events["endpoint"] == "tcp://*:5557"


def test_gpu_large_profile_splits_70b_over_two_gpus() -> None:
    argv = render(gpu_large_profile())
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert option(argv, "--tensor-parallel-size") == "2"
    assert option(argv, "--max-num-seqs") == "64"
    assert option(argv, "--max-num-batched-tokens") == "8192"
    assert option(argv, "--quantization") == "fp8"
    assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv
    assert "--enforce-eager" not in argv


def test_anchored_ranges_hold() -> None:
    # The production write-ups' ranges (design notes, "vLLM facts"): a value outside is a typo.
    assert 128 <= launch.SMALL_MAX_NUM_SEQS <= 256
    assert 32 <= launch.LARGE_MAX_NUM_SEQS <= 64
    assert 0.90 <= launch.GPU_MEMORY_UTILIZATION <= 0.92
    assert launch.GPU_MAX_NUM_BATCHED_TOKENS == 8192


def test_cpu_profile_renders_the_recipe_that_works_on_this_machine() -> None:
    argv = render(cpu_profile())
    assert argv[:5] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
    ]
    assert "serve" not in argv  # vllm-cpu 0.32.0's console script is broken
    expected = {
        "--served-model-name": "tiny",
        "--host": "127.0.0.1",
        "--port": "9001",
        "--dtype": "bfloat16",
        "--max-model-len": "2048",
        "--max-num-seqs": "16",
        "--max-num-batched-tokens": "2048",
        "--block-size": "32",
        "--num-gpu-blocks-override": "256",
    }
    assert {flag: option(argv, flag) for flag in expected} == expected
    for switch in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager"):
        assert switch in argv
    assert "--gpu-memory-utilization" not in argv and "--tensor-parallel-size" not in argv
    block_size = option(argv, "--block-size")
    assert block_size is not None and int(block_size) % 32 == 0
    # The KV cache cap is small enough that tests and benchmarks really move usage and eviction.
    assert launch.CPU_NUM_BLOCKS * launch.CPU_BLOCK_SIZE == 8192


def test_cpu_environment_binds_the_core_and_stays_offline() -> None:
    assert environment(cpu_profile()) == {
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "1",
    }
    assert environment(gpu_small_profile()) == {"VLLM_NO_USAGE_STATS": "1"}


def test_profile_values_come_from_the_named_constants() -> None:
    small, large, cpu = gpu_small_profile(), gpu_large_profile(), cpu_profile()
    assert small.max_num_seqs == launch.SMALL_MAX_NUM_SEQS
    assert large.max_num_seqs == launch.LARGE_MAX_NUM_SEQS
    assert large.tensor_parallel_size == launch.LARGE_TENSOR_PARALLEL
    assert cpu.block_size == launch.CPU_BLOCK_SIZE
    assert (
        cpu.max_model_len
        == SIZES["tiny"].max_position_embeddings
        == SIZES["small"].max_position_embeddings
    )


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"block_size": 16}, "multiple of 32"),
        ({"gpu_memory_utilization": 0.9}, "do not apply on the CPU"),
        ({"max_num_batched_tokens": 1024}, "chunked prefill"),
    ],
)
def test_inconsistent_profiles_are_rejected(overrides: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        VllmProfile.model_validate({**cpu_profile().model_dump(), **overrides})


def test_cpu_settings_are_refused_on_a_gpu_profile() -> None:
    with pytest.raises(ValidationError, match="only apply to the CPU"):
        VllmProfile.model_validate({**gpu_small_profile().model_dump(), "cpu_core": 0})


def test_a_changed_copy_renders_the_change_and_extra_args_last() -> None:
    profile = gpu_small_profile().model_copy(update={"port": 9000, "extra_args": ("--seed", "7")})
    argv = render(profile)
    assert option(argv, "--port") == "9000"
    assert argv[-2:] == ["--seed", "7"]
    assert profile.device is Device.GPU and profile.url == "http://127.0.0.1:9000"


def test_turning_prefix_caching_off_is_explicit() -> None:
    argv = render(gpu_small_profile().model_copy(update={"enable_prefix_caching": False}))
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv


def test_fleet_replicas_use_the_recipe_with_their_own_core() -> None:
    venv = Path("/opt/venv")
    argv, env = fleet.replica_argv_env(9005, 1, Path("/models/tiny"), "tiny", venv, "bfloat16")
    assert argv == render(
        cpu_dev_profile(
            "/models/tiny", "tiny", port=9005, core=1, python="/opt/venv/bin/python",
            kv_events_endpoint=kv_events_endpoint(9005),
        )
    )  # fmt: skip
    # Events on an ipc:// socket: vLLM binds it (a tcp://127.0.0.1 endpoint it would connect
    # to), and only this machine reaches it.
    assert json.loads(given(argv, "--kv-events-config"))["endpoint"].startswith("ipc://")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    argv, _ = fleet.replica_argv_env(9005, 1, Path("/models/tiny"), "tiny", venv)
    assert option(argv, "--dtype") == cpu_dtype(fleet.host_cpu_flags())


def test_bf16_only_where_the_cpu_has_native_bf16_matmul() -> None:
    assert cpu_dtype({"avx2", "avx512f", "avx512_bf16"}) == "bfloat16"
    assert cpu_dtype({"avx2", "amx_bf16", "amx_tile"}) == "bfloat16"
    assert cpu_dtype({"avx2", "fma"}) == "float32"  # AVX2-only: oneDNN's bf16 path is ~4x slower


def test_availability_names_the_missing_venv(tmp_path: Path) -> None:
    reason = fleet.vllm_cpu_available(tmp_path / "no-venv")
    assert reason is not None and "install.sh" in reason


# A stand-in for the vLLM API server: serves /health and has a child of its own, as vLLM's
# engine core is; SIGTERM kills it at once, leaving the child behind.
_PARENT_WITH_CHILD = r"""
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def _gone(children: list[tuple[int, str]]) -> bool:
    return all(fleet._start_time(pid) != started or fleet._zombie(pid) for pid, started in children)


@pytest.mark.parametrize("how", ["kill", "stop"])
async def test_a_stopped_replica_leaves_no_orphans(how: str) -> None:
    port = free_port()
    process = fleet.VllmCpuReplica(
        [sys.executable, "-c", _PARENT_WITH_CHILD, str(port)],
        f"http://127.0.0.1:{port}",
        name="fake-vllm",
    )
    process.children_grace_s = 0.2
    await process.start(timeout_s=20)
    children = fleet._descendants(process.pid)
    assert len(children) == 1 and not _gone(children)
    await (process.kill() if how == "kill" else process.stop())
    assert _gone(children)


# What vLLM itself makes of the rendered argv: its serve parser, its validation, its engine
# arguments, and (for the CPU profile, with the tiny model present) its full engine config.
_PARSE_SCRIPT = r"""
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

results = []
for case in json.loads(sys.argv[1]):
    try:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(case["argv"])
    except SystemExit:
        results.append({"ok": False})
        continue
    if args.model_tag:  # what `vllm serve MODEL` does with its positional argument
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    engine = AsyncEngineArgs.from_cli_args(args)
    # Engine settings from the engine arguments, server ones (host, port) from the namespace.
    result = {"ok": True, **{k: getattr(engine, k, getattr(args, k, None)) for k in case["fields"]}}
    if case["engine_config"]:
        config = engine.create_engine_config()
        result["config_block_size"] = config.cache_config.block_size
        result["config_prefix_caching"] = config.cache_config.enable_prefix_caching
    events = engine.kv_events_config
    result["kv_events"] = events.endpoint if events and events.enable_kv_cache_events else None
    results.append(result)
print(json.dumps(results))
"""

_FIELDS = [
    "model", "served_model_name", "host", "port", "tensor_parallel_size", "max_num_seqs",
    "max_num_batched_tokens", "gpu_memory_utilization", "enable_prefix_caching",
    "enable_chunked_prefill", "enforce_eager", "block_size", "num_gpu_blocks_override",
    "max_model_len", "dtype", "quantization",
]  # fmt: skip


def _server_args(argv: list[str]) -> list[str]:
    # Drop the program: `vllm serve` (model stays positional) or `python -m MODULE`.
    return argv[2:] if argv[0] == "vllm" else argv[3:]


def test_vllms_own_parser_accepts_every_rendered_profile() -> None:
    python = fleet.venv_python()
    if not python.is_file():
        pytest.skip(
            f"no vllm-cpu virtualenv at {python.parent.parent} (replica/vllm_cpu/install.sh)"
        )
    model_dir = default_dir("tiny")
    with_model = has_model(model_dir)
    profiles = [
        gpu_small_profile(),
        gpu_large_profile(),
        cpu_dev_profile(
            str(model_dir), "tiny-llama", port=9001, core=0, python=str(python),
            kv_events_endpoint=kv_events_endpoint(9001),
        ),
    ]  # fmt: skip
    cases = [
        {
            "argv": _server_args(render(p)),
            "fields": _FIELDS,
            "engine_config": p.device is Device.CPU and with_model,
        }
        for p in profiles
    ]
    # A typo must fail, or this test would prove nothing.
    cases.append(
        {"argv": ["some/model", "--enable-prefix-cacheing"], "fields": [], "engine_config": False}
    )
    # Offline mode makes vLLM resolve a Hub id to a local snapshot (there is none here); the
    # GPU profiles name Hub ids, and the CPU one a local directory that needs no Hub either way.
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env |= {k: v for k, v in environment(profiles[2]).items() if k.startswith("VLLM_")}
    result = subprocess.run(
        [str(python), "-c", _PARSE_SCRIPT, json.dumps(cases)],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["ok"] for r in parsed] == [True, True, True, False]
    for profile, seen in zip(profiles, parsed, strict=False):
        assert seen["model"] == profile.model
        assert seen["served_model_name"] == [profile.served_model_name]
        assert (seen["host"], seen["port"]) == (profile.host, profile.port)
        assert seen["tensor_parallel_size"] == profile.tensor_parallel_size
        assert seen["max_num_seqs"] == profile.max_num_seqs
        assert seen["max_num_batched_tokens"] == profile.max_num_batched_tokens
        assert seen["enable_prefix_caching"] is True
        assert seen["enforce_eager"] is profile.enforce_eager
        assert seen["quantization"] == profile.quantization
        if profile.gpu_memory_utilization is not None:
            assert seen["gpu_memory_utilization"] == profile.gpu_memory_utilization
        if profile.enable_chunked_prefill:
            assert seen["enable_chunked_prefill"] is True
        assert seen["kv_events"] == profile.kv_events_endpoint
    cpu = parsed[2]
    assert (cpu["block_size"], cpu["num_gpu_blocks_override"], cpu["max_model_len"]) == (
        32,
        256,
        2048,
    )
    if with_model:
        assert cpu["config_block_size"] == 32 and cpu["config_prefix_caching"] is True
