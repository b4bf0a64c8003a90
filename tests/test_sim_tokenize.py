"""The simulated replica's vLLM tokenizer endpoints: /tokenize, /detokenize and render.

They must give the very tokens generation prefills for the same body, in vLLM's shapes, so a
router that matches prefixes on tokens (vllm-router cache_aware) runs its real path on the sim.
"""

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import xxhash
from aiohttp.test_utils import TestServer

from replica.sim.config import SimConfig
from replica.sim.server import build_app
from replica.sim.tokenizer import VOCAB, render_chat, tokenize

ZERO_DELAY = {"prefill_s_per_token": 0.0, "decode_step_s": 0.0, "decode_s_per_seq": 0.0}
SYSTEM = "You are the agent of the routing team; answer with care. " * 8
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Which module owns the prefix index?"},
]
CHAT: dict[str, Any] = {"model": "sim-model", "messages": MESSAGES, "tools": TOOLS}

Post = Callable[..., Awaitable[tuple[int, Any]]]


@pytest.fixture
async def post() -> AsyncIterator[Post]:
    servers: list[TestServer] = []
    session = aiohttp.ClientSession()

    async def send(
        path: str,
        body: object,
        headers: dict[str, str] | None = None,
        **config: object,
    ) -> tuple[int, Any]:
        if not servers or config:
            server = TestServer(build_app(SimConfig.model_validate({**ZERO_DELAY, **config})))
            await server.start_server()
            servers.append(server)
        url = str(servers[-1].make_url(path))
        data = body if isinstance(body, bytes) else None
        json = None if isinstance(body, bytes) else body
        async with session.post(url, data=data, json=json, headers=headers) as response:
            return response.status, await response.json()

    yield send
    await session.close()
    for server in servers:
        await server.close()


async def test_tokenize_a_prompt_in_vllms_shape(post: Post) -> None:
    status, body = await post("/tokenize", {"model": "sim-model", "prompt": "Once upon a time"})
    assert status == 200
    assert body == {
        "count": 4,
        "max_model_len": 32768,
        "tokens": tokenize("Once upon a time", 4),
        "token_strs": None,
    }
    _, with_strs = await post(
        "/tokenize", {"prompt": "Once upon a time", "return_token_strs": True}
    )
    assert with_strs["token_strs"] == ["Once", " upo", "n a ", "time"]


async def test_tokenize_chat_gives_the_tokens_generation_prefills(post: Post) -> None:
    status, tokenized = await post("/tokenize", CHAT)
    assert status == 200
    assert tokenized["tokens"] == tokenize(render_chat(MESSAGES, TOOLS), 4)
    _, answer = await post("/v1/chat/completions", {**CHAT, "max_tokens": 2})
    assert answer["usage"]["prompt_tokens"] == tokenized["count"]


async def test_tools_and_tool_calls_are_part_of_the_prompt(post: Post) -> None:
    _, bare = await post("/tokenize", {"messages": CHAT["messages"]})
    _, with_tools = await post("/tokenize", CHAT)
    assert with_tools["count"] > bare["count"] + 30

    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    history = [*CHAT["messages"], {"role": "assistant", "content": None, "tool_calls": [call]}]
    turn = [*history, {"role": "tool", "tool_call_id": "c1", "content": "index.py"}]
    _, called = await post("/tokenize", {**CHAT, "messages": turn})
    without_call = [*CHAT["messages"], {"role": "assistant", "content": None}, turn[-1]]
    _, not_called = await post("/tokenize", {**CHAT, "messages": without_call})
    assert called["count"] > not_called["count"]
    # A conversation that grows keeps its earlier tokens as a prefix: what a prefix cache needs
    # (all but the last token, which may hold the start of the next message).
    _, history = await post("/tokenize", {**CHAT, "add_generation_prompt": False})
    lead = history["tokens"][:-1]
    assert len(lead) > 100 and called["tokens"][: len(lead)] == lead


async def test_generation_prompt_options(post: Post) -> None:
    _, default = await post("/tokenize", CHAT)
    _, without = await post("/tokenize", {**CHAT, "add_generation_prompt": False})
    assert without["count"] < default["count"]
    text = render_chat(MESSAGES, TOOLS, add_generation_prompt=False)
    assert without["tokens"] == tokenize(text, 4)
    _, continued = await post("/tokenize", {**CHAT, "continue_final_message": True})
    text = render_chat(MESSAGES, TOOLS, continue_final_message=True)
    assert continued["tokens"] == tokenize(text, 4) and text.endswith("prefix index?")
    status, error = await post(
        "/tokenize", {**CHAT, "continue_final_message": True, "add_generation_prompt": True}
    )
    assert status == 400 and error["error"]["type"] == "BadRequestError"


async def test_chat_render_is_vllms_generate_request(post: Post) -> None:
    body = {**CHAT, "max_tokens": 7, "stream": True, "continue_final_message": False}
    status, rendered = await post(
        "/v1/chat/completions/render", body, headers={"x-request-id": "req-7"}
    )
    assert status == 200
    _, tokenized = await post("/tokenize", CHAT)
    assert rendered["token_ids"] == tokenized["tokens"]
    assert rendered["request_id"] == "chatcmpl-req-7"
    assert rendered["sampling_params"]["max_tokens"] == 7
    assert rendered["model"] == "sim-model" and rendered["stream"] is True
    assert {"features", "cache_salt", "priority"} <= set(rendered)


async def test_completion_render_is_a_list_of_one(post: Post) -> None:
    status, rendered = await post("/v1/completions/render", {"prompt": "Once upon a time"})
    assert status == 200
    assert [r["token_ids"] for r in rendered] == [tokenize("Once upon a time", 4)]
    assert rendered[0]["request_id"].startswith("cmpl-")
    assert rendered[0]["sampling_params"]["max_tokens"] == 16  # the sim's default


async def test_rendered_tokens_hit_the_cache_the_chat_warmed(post: Post) -> None:
    _, _ = await post("/v1/chat/completions", {**CHAT, "max_tokens": 1})
    _, rendered = await post("/v1/chat/completions/render", CHAT)
    _, answer = await post("/v1/completions", {"prompt": rendered["token_ids"], "max_tokens": 1})
    prompt_tokens = len(rendered["token_ids"])
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Every full 16-token block but the one holding the last token, which vLLM recomputes.
    assert cached == (prompt_tokens - 1) // 16 * 16


async def test_detokenize_inverts_what_the_replica_produced(post: Post) -> None:
    text = render_chat(MESSAGES, TOOLS)
    _, tokenized = await post("/tokenize", CHAT)
    status, body = await post("/detokenize", {"model": "sim-model", "tokens": tokenized["tokens"]})
    assert (status, body) == (200, {"prompt": text})
    _, words = await post("/detokenize", {"tokens": [0, 1, 2]})
    assert words["prompt"] == "".join(word + " " for word in VOCAB[:3])


async def test_detokenize_of_an_id_outside_the_vocabulary_is_no_text(post: Post) -> None:
    # vLLM's tokenizer skips ids it has no piece for; the sim's vocabulary is what it has seen.
    status, body = await post("/detokenize", {"tokens": [987654321, 0, 2**40]})
    assert (status, body) == (200, {"prompt": VOCAB[0] + " "})


async def test_detokenize_of_a_prompt_sent_only_for_generation(post: Post) -> None:
    _, _ = await post("/v1/completions", {"prompt": "a prompt never tokenized", "max_tokens": 1})
    _, body = await post("/detokenize", {"tokens": tokenize("a prompt never tokenized", 4)})
    assert body["prompt"] == "a prompt never tokenized"


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
        ("/detokenize", {"model": "gpt-4", "tokens": [1]}, 404, "model"),
        ("/v1/chat/completions/render", {**CHAT, "model": "gpt-4"}, 404, "model"),
        ("/v1/completions/render", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
        ("/tokenize", b"{not json", 400, None),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {**CHAT, "chat_template": "{{ messages }}"}, 400, "chat_template"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/v1/chat/completions/render", {"messages": [{"content": "x"}]}, 400, "messages"),
        ("/v1/completions/render", {"prompt": "x" * 400}, 400, "input_tokens"),
    ],
)
async def test_errors_use_vllms_error_body(
    post: Post, path: str, body: object, status: int, param: str | None
) -> None:
    got, answer = await post(path, body, max_model_len=64)
    assert got == status
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    kind = {400: "BadRequestError", 404: "NotFoundError"}[status]
    assert answer["error"]["type"] == kind and answer["error"]["code"] == status
    assert answer["error"]["param"] == param and answer["error"]["message"]


@pytest.mark.parametrize("text", ["plain ascii text, 4 chars a token", "héllo wörld, ünïcode!", ""])
def test_tokens_are_chunks_of_characters_not_bytes(text: str) -> None:
    chunks = [text[i : i + 4] for i in range(0, len(text), 4)]
    assert tokenize(text, 4) == [xxhash.xxh32_intdigest(chunk.encode()) for chunk in chunks]
