"""A deterministic stand-in for a model's tokenizer, chat template and sampler.

Nothing here is linguistically meaningful; what matters is that the same input always gives
the same tokens and the same output, so that prefix caching, streamed-versus-whole answers
and repeated runs behave exactly like a real engine with greedy sampling.
"""

from array import array
from collections.abc import Mapping, Sequence

import orjson
import xxhash

# Short, distinct words: the output must look like text and stay cheap to produce.
VOCAB: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it",
    "as", "was", "with", "be", "by", "on", "not", "he", "this", "are",
    "or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
    "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "model",
    "token", "cache", "prefix", "block", "route", "replica", "gateway", "batch",
    "queue", "prompt", "stream", "answer", "simple", "fast",
)  # fmt: skip


class TemplateError(ValueError):
    """The messages cannot be rendered: the client sent a malformed conversation."""


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping):
                raise TemplateError("each content part must be an object")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise TemplateError("a text content part needs a string 'text'")
                texts.append(text)
        # vLLM joins text parts with newlines when it flattens multi-part content.
        return "\n".join(texts)
    raise TemplateError("message content must be a string or a list of parts")


def _tool_calls_text(tool_calls: object) -> str:
    if not isinstance(tool_calls, list) or not all(isinstance(c, Mapping) for c in tool_calls):
        raise TemplateError("'tool_calls' must be a list of objects")
    return orjson.dumps(tool_calls).decode()


def render_chat(
    messages: Sequence[Mapping[str, object]],
    tools: Sequence[Mapping[str, object]] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """Render an OpenAI message list with a fixed template, by default ending in the
    assistant's turn.

    Tool definitions come first, as one block (real templates put them in or beside the system
    turn; either way they are part of the shared lead), and an assistant's ``tool_calls``
    follow its content, so tools and tool calls are prefilled like any other text. With
    ``continue_final_message`` the last message stays open (no newline after it, no generation
    prompt), as vLLM's option of the same name.
    """
    pieces: list[str] = []
    if tools:
        if not all(isinstance(tool, Mapping) for tool in tools):
            raise TemplateError("each tool must be an object")
        pieces.append(f"<|tools|>\n{orjson.dumps(list(tools)).decode()}\n")
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise TemplateError("each message needs a string 'role'")
        text = _content_text(message.get("content"))
        tool_calls = message.get("tool_calls")
        if tool_calls:
            text += "\n<|tool_calls|>" + _tool_calls_text(tool_calls)
        pieces.append(f"<|{role}|>\n{text}\n")
    if continue_final_message:
        if not messages:
            raise TemplateError("continue_final_message needs a final message to continue")
        pieces[-1] = pieces[-1][:-1]
    elif add_generation_prompt:
        pieces.append("<|assistant|>\n")
    return "".join(pieces)


def tokenize(text: str, chars_per_token: int) -> list[int]:
    """Cut the text into fixed-size character chunks and hash each one to a token id.

    Equal text prefixes give equal token prefixes, which is all a prefix cache needs.
    """
    if text.isascii():
        # One character is one byte: slice the encoded bytes (same ids, ~2x faster on the
        # 200 KB prompts of the agents workload, which render and generation both tokenize).
        data = text.encode()
        return [
            xxhash.xxh32_intdigest(data[i : i + chars_per_token])
            for i in range(0, len(data), chars_per_token)
        ]
    return [
        xxhash.xxh32_intdigest(text[i : i + chars_per_token].encode())
        for i in range(0, len(text), chars_per_token)
    ]


def token_strs(text: str, chars_per_token: int) -> list[str]:
    """The text of each token ``tokenize`` gives for ``text``, in order."""
    return [text[i : i + chars_per_token] for i in range(0, len(text), chars_per_token)]


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Pack token ids for hashing; one fixed width so that slices line up with tokens."""
    return array("Q", tokens).tobytes()


def prompt_hash(tokens: Sequence[int]) -> int:
    """The seed of a request's output: a function of its whole prompt."""
    return xxhash.xxh3_64_intdigest(token_bytes(tokens))


def output_token(seed: int, index: int) -> int:
    """The id of output token ``index`` for a prompt with the given seed (greedy, repeatable)."""
    return xxhash.xxh3_64_intdigest(index.to_bytes(8, "little"), seed=seed) % len(VOCAB)


def detokenize(token_id: int) -> str:
    """Text of one output token; each is a word followed by a space."""
    return VOCAB[token_id] + " "


def adapter_salt(base_model: str, model: str) -> int:
    """Seeds an adapter's KV blocks and output (0 for the base model): vLLM keys cached blocks
    by LoRA, and an adapter's weights answer differently."""
    if model == base_model:
        return 0
    return xxhash.xxh3_64_intdigest(f"lora\x00{model}".encode())
