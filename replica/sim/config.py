"""Every knob of the simulated replica, with its default, in one place, and its command line."""

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class SimConfig(BaseModel):
    """Configuration of one simulated vLLM replica.

    The timing defaults model an 8B model on one H100-class GPU: prefill runs at about
    20k tokens/s (5e-5 s per uncached prompt token) and a decode step takes about 8 ms at
    batch size 1, rising by 0.2 ms per sequence in the batch. The KV defaults (1,024 blocks
    of 16 tokens) are deliberately small so that cache pressure, eviction and queueing show
    up in tests and benchmarks without thousands of requests.

    Setting ``prefill_s_per_token``, ``decode_step_s`` and ``decode_s_per_seq`` all to 0
    gives a zero-delay replica: what remains is HTTP and scheduling overhead, which is what
    a benchmark of the gateway's own cost wants to sit on top of.
    """

    # No inf or nan: a step of inf seconds never ends, and nan passes every bound.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on (vLLM's default)")
    model: str = Field("sim-model", min_length=1, description="served model name")
    max_num_seqs: int = Field(16, ge=1, description="most requests running at once")
    num_blocks: int = Field(1024, ge=1, description="KV cache size in blocks")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
    kv_offload_blocks: int = Field(
        0,
        ge=0,
        description="blocks of a CPU tier behind the KV cache, as vLLM's CPU offloading keeps "
        "(every computed block written to it; a prefix the cache lost loaded back); 0: none",
    )
    kv_offload_block_size: int = Field(
        0,
        ge=0,
        description="tokens per block of the CPU tier, a multiple of block_size (the connector's "
        "block_size: vLLM's usage guide sets 64); 0: block_size, the connector's default",
    )
    kv_load_share: float = Field(
        0.05,
        ge=0,
        description="time to load a block back from the CPU tier, as a share of computing it: an "
        "8B model's KV (128 KiB a token) over PCIe 5 (~50 GB/s: 2.6 us) against 50 us of prefill",
    )
    max_num_batched_tokens: int = Field(
        2048, ge=1, description="prefill token budget per engine step (chunked prefill)"
    )
    prefill_s_per_token: float = Field(
        5e-5, ge=0, description="seconds of prefill per uncached prompt token"
    )
    decode_step_s: float = Field(0.008, ge=0, description="fixed seconds per decode step")
    decode_s_per_seq: float = Field(
        0.0002, ge=0, description="extra decode-step seconds per decoding sequence"
    )
    default_max_tokens: int = Field(
        16, ge=1, description="completion length when the request sets no max_tokens"
    )
    max_model_len: int = Field(32768, ge=1, description="longest prompt + completion in tokens")
    chars_per_token: int = Field(4, ge=1, description="characters per simulated token")
    lora_modules: str = Field(
        "",
        description="LoRA adapters served besides the model, as vLLM's --lora-modules: "
        "name=path pairs (or bare names), separated by spaces or commas",
    )
    embedding_dim: int = Field(32, ge=1, description="length of /v1/embeddings vectors")
    kv_events_config: str = Field(
        "",
        description="publish KV-cache events as vLLM's --kv-events-config does: its JSON, "
        'e.g. \'{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557"}\'',
    )

    # Field validators, not one on the model: each mistake then names its field (its flag).
    @field_validator("kv_offload_block_size")
    @classmethod
    def _tier_blocks_whole(cls, size: int, info: ValidationInfo) -> int:
        block_size = info.data.get("block_size")  # absent when it was refused itself
        if block_size and size % block_size:
            raise ValueError(f"must be a multiple of block_size ({block_size})")
        return size

    @field_validator("lora_modules")
    @classmethod
    def _adapters_named(cls, text: str) -> str:
        for item in text.replace(",", " ").split():
            name, sep, path = item.partition("=")
            if not name or (sep and not path):
                raise ValueError(f"{item!r} is neither NAME=PATH nor a bare NAME")
        return text

    @field_validator("kv_events_config")
    @classmethod
    def _events_config_readable(cls, text: str) -> str:
        # Here, not first in the engine: a mistake is refused before anything starts. Imported
        # here: only a replica that publishes events needs ZeroMQ loaded.
        from replica.sim.kv_events import KvEventsConfig

        KvEventsConfig.parse(text)
        return text

    @property
    def kv_offload_factor(self) -> int:
        """KV-cache blocks per CPU-tier block."""
        return max(self.kv_offload_block_size // self.block_size, 1)

    def adapters(self) -> dict[str, str]:
        """Adapter name -> its path, as /v1/models lists it (a bare name is its own path)."""
        pairs = (item.partition("=") for item in self.lora_modules.replace(",", " ").split())
        return {name: path or name for name, _, path in pairs if name}

    def serves(self, model: str) -> bool:
        return model == self.model or model in self.adapters()


_FLAG_TYPES: dict[object, type] = {int: int, float: float, str: str}


def add_arguments(
    parser: argparse.ArgumentParser, types: Mapping[str, Callable[[str], Any]] | None = None
) -> None:
    """Add ``--kebab-case`` flags for every SimConfig field, defaults taken from SimConfig;
    ``types``: a field's argparse type instead of its plain int, float or str (the gateway's
    CLI gives its port type, shared by every port flag of its commands)."""
    for name, field in SimConfig.model_fields.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=(types or {}).get(name, _FLAG_TYPES[field.annotation]),
            default=field.default,
            help=f"{field.description} (default: %(default)s)",
        )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(**{name: getattr(args, name) for name in SimConfig.model_fields})
