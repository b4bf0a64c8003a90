"""The picker over its gRPC port, with no Envoy: a script plays Envoy's side of the
external-processing stream against `llm-gateway epp`'s app in-process. What the replica gets is
the body `serve` would send, an answer the client had whole counts as the replica's, and a
stored response's lookup goes to the replica that holds it, for its owner only."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
import pytest
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from gateway.app_keys import MEMORY, METRICS, OUTLIERS, POLICY
from gateway.picker import picker as picker_module
from gateway.picker.envoy_config import DESTINATION, FALLBACKS, LB_NAMESPACE
from gateway.picker.picker import Picker
from gateway.picker.server import add_picker
from gateway.picker.service import ExternalProcessor
from gateway.routing.affinity import ReplicaRef
from gateway.settings import Settings
from replica.processes import free_port
from router_policies.fingerprint import canonical_chat
from tests.conftest import GatewayClient, in_process_gateway, in_process_sims, metric
from tests.rate_limits import ACME_KEY, GLOBEX_KEY, tenant
from tests.tiers import EASY, HARD

CHAT = "/v1/chat/completions"
TIERS: dict[str, Any] = {"auto": {"small": "small", "large": "large"}}


@contextlib.asynccontextmanager
async def picker(
    tiers: bool = True, limits: dict[str, Any] | None = None, **small_pool: Any
) -> AsyncIterator[tuple[GatewayClient, Any]]:
    """The picker's app (its /metrics behind the client) and a stub of its gRPC service; a
    small and a large pool of one simulated replica each (``replicas`` in the small one),
    behind the tier `auto`; ``small_pool``: more of the small pool's settings."""
    port = free_port("127.0.0.1")
    async with (
        in_process_sims(small_pool.pop("replicas", 1), "small-model") as small,
        in_process_sims(1, "large-model") as large,
    ):
        policy: dict[str, Any] = {
            "pools": {
                "small": {"model": "small-model", "replicas": small, **small_pool},
                "large": {"model": "large-model", "replicas": large},
            },
        }
        if tiers:
            policy["tiers"] = TIERS
        if limits is not None:
            policy["limits"] = limits
        extend = lambda app: add_picker(app, "127.0.0.1", port)  # noqa: E731
        async with (
            in_process_gateway(policy, extend) as client,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            yield client, pb_grpc.ExternalProcessorStub(channel)


def request_headers(**extra: str) -> Any:
    sent = {":method": "POST", ":path": CHAT, "content-type": "application/json", **extra}
    values = [core.HeaderValue(key=k, raw_value=v.encode()) for k, v in sent.items()]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=core.HeaderMap(headers=values))
    )


def request_body(body: bytes) -> Any:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))


def answer_headers(content_type: str, length: int | None = None, status: int = 200) -> Any:
    sent = {":status": str(status), "content-type": content_type}
    if length is not None:
        sent["content-length"] = str(length)
    values = [core.HeaderValue(key=k, raw_value=v.encode()) for k, v in sent.items()]
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=core.HeaderMap(headers=values))
    )


def answer_chunk(body: bytes) -> Any:
    """A chunk of the answer that is not its end: the client leaves before that comes."""
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=False))


async def pick(stub: Any, body: bytes, **extra: str) -> tuple[Any, Any]:
    """Envoy's side up to the picker's answer to the body: the call, and that answer's
    CommonResponse."""
    call = stub.Process()
    await call.write(request_headers(**extra))
    await call.read()
    await call.write(request_body(body))
    answer = await call.read()
    assert answer.WhichOneof("response") == "request_body", answer
    return call, answer.request_body.response


async def relay(call: Any, *messages: Any) -> None:
    """Sends the answer's ``messages``, each once the picker has answered the one before."""
    for message in messages:
        await call.write(message)
        await call.read()


async def hang_up(call: Any, *messages: Any) -> None:
    """Sends the answer's ``messages``, then ends the stream as Envoy does when the client
    leaves, and waits until the picker has done with it."""
    await relay(call, *messages)
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF


def sent_to_replica(common: Any) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The body the picker has Envoy send in place of the client's, the headers it sets and
    those it removes."""
    mutation = common.header_mutation
    values = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    assert common.body_mutation.body, "Envoy would send the client's own body"
    body = common.body_mutation.body
    assert values["content-length"] == str(len(body))
    return orjson.loads(body), values, list(mutation.remove_headers)


@pytest.mark.parametrize(
    ("text", "model"), [(EASY, "small-model"), (HARD, "large-model")], ids=["easy", "hard"]
)
@pytest.mark.parametrize(
    "extra",
    [{}, {"stream": True, "stream_options": {"include_usage": True}}],
    ids=["whole", "stream-asking-usage"],
)
async def test_a_tiered_request_reaches_the_replica_naming_its_pools_model(
    text: str, model: str, extra: dict[str, Any]
) -> None:
    """As through `serve`: the tier `auto` is no model a replica knows."""
    async with picker() as (_, stub):
        body = {"model": "auto", "messages": [{"role": "user", "content": text}], **extra}
        call, common = await pick(stub, orjson.dumps(body))
        got, _, removed = sent_to_replica(common)
        await hang_up(call)
    assert got == {**body, "model": model}
    assert removed == []


async def test_a_gzip_tiered_request_reaches_the_replica_decoded_without_its_encoding() -> None:
    async with picker() as (_, stub):
        body = {"model": "auto", "messages": [{"role": "user", "content": EASY}]}
        call, common = await pick(
            stub, gzip.compress(orjson.dumps(body)), **{"content-encoding": "gzip"}
        )
        got, _, removed = sent_to_replica(common)
        await hang_up(call)
    assert got == {**body, "model": "small-model"}
    assert removed == ["content-encoding"]


async def test_a_request_the_gateway_sends_as_it_came_is_not_sent_back_to_envoy() -> None:
    async with picker(tiers=False) as (_, stub):
        body = {"model": "small-model", "messages": [{"role": "user", "content": EASY}]}
        call, common = await pick(stub, orjson.dumps(body))
        await hang_up(call)
    assert not common.HasField("body_mutation")
    assert "content-length" not in {h.header.key for h in common.header_mutation.set_headers}


async def test_a_body_as_large_as_the_limit_envoy_buffers_is_picked_for() -> None:
    """Envoy buffers a body up to the body limit and sends it whole, in one message a little
    larger than it: gRPC's own 4 MiB limit would fail the stream, and Envoy carry on without
    the picker (no key checked, no limits, any replica)."""
    async with picker(tiers=False) as (_, stub):
        body = orjson.dumps({"model": "small-model", "messages": [{"role": "user", "content": ""}]})
        padded = body[:-1] + b" " * (Settings().max_body_bytes - len(body)) + b"}"
        call, common = await pick(stub, padded)
        await hang_up(call)
    destination = {h.header.key: h.header.raw_value for h in common.header_mutation.set_headers}
    assert DESTINATION in destination


async def destinations(stub: Any, body: dict[str, Any]) -> list[str]:
    """Envoy's side up to the picker's answer to the body, then its hang-up: the endpoints the
    answer names, in the order Envoy tries them."""
    call = stub.Process()
    await call.write(request_headers())
    await call.read()
    await call.write(request_body(orjson.dumps(body)))
    named = await call.read()
    await hang_up(call)
    lb = named.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields[DESTINATION]
    return list(lb.string_value.split(","))


def addresses(client: GatewayClient) -> list[str]:
    """The small pool's replicas as Envoy names them."""
    assert client.app is not None
    replicas = client.app[POLICY].fleet.pools["small"].replicas.values()
    return [r.url.removeprefix("http://") for r in replicas]


async def test_envoys_every_try_goes_to_the_pool_even_where_it_has_fewer_replicas() -> None:
    """Past the endpoints named, Envoy's fallback policy picks among every pool's replicas: a
    retry there could reach another model's replica. A pool of one names its replica again."""
    async with picker(tiers=False) as (client, stub):
        body = {"model": "small-model", "messages": [{"role": "user", "content": EASY}]}
        named = await destinations(stub, body)
    assert named == addresses(client) * (1 + FALLBACKS)


async def test_an_adapters_fallbacks_are_the_replicas_serve_would_retry_on() -> None:
    """The first try goes to the adapter's home (where it is loaded, or to be loaded); a retry,
    in `serve` as through Envoy, to any replica that can load it, not to none."""
    async with picker(tiers=False, replicas=3, adapters=["sql-lora"]) as (client, stub):
        body = {"model": "sql-lora", "messages": [{"role": "user", "content": EASY}]}
        named = await destinations(stub, body)
    assert sorted(named) == sorted(addresses(client))


async def test_a_fallback_whose_name_does_not_resolve_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica named by a host name the resolver fails on (a moment's DNS failure): the
    request goes on to the chosen replica, not a 500 for a fallback it may never need."""
    resolved: list[str] = []

    async def resolver_failing_after_one(url: str) -> str:
        if resolved:
            raise OSError("Temporary failure in name resolution")
        resolved.append(url)
        return url.removeprefix("http://")

    monkeypatch.setattr(picker_module, "_resolve", resolver_failing_after_one)
    async with picker(tiers=False, replicas=3) as (_, stub):
        body = {"model": "small-model", "messages": [{"role": "user", "content": EASY}]}
        named = await destinations(stub, body)
    assert named == [resolved[0].removeprefix("http://")] * (1 + FALLBACKS)


async def test_a_request_whose_replica_cannot_be_resolved_was_never_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 502 `replica_unreachable` reached no replica: its conversation's hard turn is not
    remembered as gone large, and the next turn goes by its own score."""
    resolving = False

    async def resolver(url: str) -> str:
        if not resolving:
            raise OSError("Temporary failure in name resolution")
        return url.removeprefix("http://")

    monkeypatch.setattr(picker_module, "_resolve", resolver)
    turns = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}]
    hard = {"model": "auto", "messages": [*turns, {"role": "user", "content": HARD}]}
    later = [*hard["messages"], {"role": "assistant", "content": "Done."}]
    async with picker() as (client, stub):
        call = stub.Process()
        await call.write(request_headers())
        await call.read()
        await call.write(request_body(orjson.dumps(hard)))
        refused = await call.read()
        call.cancel()
        resolving = True
        named = await destinations(
            stub, {**hard, "messages": [*later, {"role": "user", "content": "Shorter?"}]}
        )
        assert refused.immediate_response.status.code == 502
        assert named[0] in addresses(client)  # the small pool's


STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
)
WHOLE = orjson.dumps({"choices": [{"index": 0, "message": {"content": "hi"}}]})
REFUSAL = b'data: {"error": {"message": "bad schema", "type": "BadRequestError", "code": 400}}\n\n'
"""vLLM's error event whose code says the request is at fault: counted as that 4xx."""
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("stream", "answer", "code"),
    [
        (
            True,
            [answer_headers("text/event-stream"), answer_chunk(STREAM + DONE)],
            "200",
        ),
        (True, [answer_headers("text/event-stream"), answer_chunk(STREAM)], "499"),
        (
            True,
            [answer_headers("text/event-stream"), answer_chunk(STREAM + REFUSAL + DONE)],
            "400",
        ),
        (False, [answer_headers("application/json", len(WHOLE)), answer_chunk(WHOLE)], "200"),
        (False, [answer_headers("application/json", len(WHOLE)), answer_chunk(WHOLE[:-1])], "499"),
        (False, [answer_headers("application/json"), answer_chunk(WHOLE)], "499"),
    ],
    ids=[
        "stream-to-done",
        "stream-cut",
        "stream-refused-midway",
        "body-to-length",
        "body-cut",
        "body-no-length",
    ],
)
async def test_a_client_leaving_after_the_whole_answer_counts_as_the_replicas_status(
    stream: bool, answer: list[Any], code: str
) -> None:
    """The sync OpenAI SDK closes at `data: [DONE]`, before the chunked body's end: Envoy
    then ends the picker's stream before the answer's end. An answer the client had whole is
    the replica's; one it left before the end is a client that left (499)."""
    async with picker(tiers=False) as (client, stub):
        body = {"model": "small-model", "messages": [{"role": "user", "content": EASY}]}
        call, _ = await pick(stub, orjson.dumps({**body, "stream": stream}))
        await hang_up(call, *answer)
        text = await (await client.get("/metrics")).text()
    assert metric(text, "gateway_requests_total", pool="small", code=code) == 1


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "body"])
async def test_a_client_leaving_midway_leaves_the_replicas_failures_as_they_were(
    stream: bool,
) -> None:
    """A replica hanging in its prefill sees every client give up: were each such leaving its
    success, its failures would never add up to an ejection."""
    cut = [answer_headers("text/event-stream"), answer_chunk(STREAM)]
    if not stream:
        cut = [answer_headers("application/json", len(WHOLE)), answer_chunk(WHOLE[:-1])]
    async with picker(tiers=False) as (client, stub):
        app = client.app
        assert app is not None
        [replica] = app[POLICY].fleet.pools["small"].replicas.values()
        replica.outlier.consecutive_failures = 2
        body = {"model": "small-model", "messages": [{"role": "user", "content": EASY}]}
        call, _ = await pick(stub, orjson.dumps({**body, "stream": stream}))
        await hang_up(call, *cut)
        text = await (await client.get("/metrics")).text()
    assert metric(text, "gateway_requests_total", pool="small", code="499") == 1
    assert replica.outlier.consecutive_failures == 2


class ResettingEnvoy:
    """Envoy's side of a stream as a script, for the servicer called directly: ``messages``
    one at a time, then a reset while the picker's answer to the last is on its way (gRPC
    cancels that write)."""

    def __init__(self, messages: list[Any]) -> None:
        self._messages = list(messages)

    async def read(self) -> Any:
        return self._messages.pop(0) if self._messages else grpc.aio.EOF

    async def write(self, response: Any) -> None:
        if not self._messages:
            raise asyncio.CancelledError


async def test_a_stream_envoy_resets_after_its_end_counts_as_the_replicas_status() -> None:
    """Envoy may end the picker's stream by resetting it as the answer to the stream's last
    chunk goes, rather than closing it after: the same client, gone after the whole stream."""
    async with picker(tiers=False) as (client, _):
        app = client.app
        assert app is not None
        body = {"model": "small-model", "messages": [{"role": "user", "content": EASY}]}
        envoy = ResettingEnvoy(
            [
                request_headers(),
                request_body(orjson.dumps({**body, "stream": True})),
                answer_headers("text/event-stream"),
                answer_chunk(STREAM + DONE),
            ]
        )
        service = ExternalProcessor(app, Picker(app[METRICS], app[OUTLIERS]))
        with contextlib.suppress(asyncio.CancelledError):
            await service.Process(None, envoy)
        text = await (await client.get("/metrics")).text()
    assert metric(text, "gateway_requests_total", pool="small", code="200") == 1


async def test_a_percent_encoded_completion_path_is_routed_as_the_replica_reads_it() -> None:
    # vLLM decodes the path: passed on unrouted, it would generate with no key and no limit.
    body = orjson.dumps({"model": "small-model", "messages": [{"role": "user", "content": "hi"}]})
    async with picker(tiers=False) as (_, stub):
        call, common = await pick(stub, body, **{":path": "/v1/chat/%63ompletions"})
        call.cancel()
    assert DESTINATION in {h.header.key for h in common.header_mutation.set_headers}


@pytest.mark.parametrize(
    ("method", "path", "key", "answered"),
    [
        ("GET", "/v1/models", None, 401),
        ("GET", "/v1/responses/resp_1", "sk-not-a-tenant", 401),
        ("POST", "/invocations", None, 401),
        ("GET", "/v1/models", ACME_KEY, None),
        ("GET", "/health", None, None),  # a probe
    ],
)
async def test_with_tenants_what_the_picker_does_not_route_needs_a_tenants_key_too(
    method: str, path: str, key: str | None, answered: int | None
) -> None:
    limits = {"tenants": {"acme": tenant(ACME_KEY, requests_per_minute=100)}}
    sent = {":method": method, ":path": path}
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    async with picker(tiers=False, limits=limits) as (_, stub):
        call = stub.Process()
        await call.write(request_headers(**sent))
        answer = await call.read()
        call.cancel()
    if answered is None:
        assert answer.WhichOneof("response") == "request_headers"  # goes on to a replica
    else:
        assert answer.immediate_response.status.code == answered
        assert orjson.loads(answer.immediate_response.body)["error"]["code"] == "invalid_api_key"


async def test_a_prompt_the_replica_refused_is_not_believed_held_there() -> None:
    """vLLM refuses a prompt past its context with a 400 before prefilling any of it: as
    through `serve`, the index takes back what it recorded of it."""
    messages = [{"role": "user", "content": "a document pasted whole " * 2000}]
    refusal = orjson.dumps({"error": {"message": "too long", "type": "BadRequestError"}})
    async with picker(tiers=False) as (client, stub):
        call, _ = await pick(stub, orjson.dumps({"model": "small-model", "messages": messages}))
        await hang_up(
            call,
            answer_headers("application/json", len(refusal), status=400),
            answer_chunk(refusal),
        )
        assert client.app is not None
        pool = client.app[POLICY].fleet.pools["small"]
        replica = next(iter(pool.replicas))
        request = pool.router.features("small-model", lambda: canonical_chat(messages))
        assert request.block_hashes
        assert pool.router.estimated_cached_bytes(replica, request) == 0


def home_of(client: GatewayClient, response_id: str, owner: str | None = None) -> Any:
    """The small pool's replica, made the home of ``response_id`` as if it had stored it."""
    app = client.app
    assert app is not None
    replica = next(iter(app[POLICY].fleet.pools["small"].replicas.values()))
    app[MEMORY].responses.remember(response_id, ReplicaRef("small", replica.name, owner))
    return replica


async def test_a_lookup_is_sent_to_the_replica_that_stored_the_response_on_every_try() -> None:
    """Named in the answer to the request's headers: a GET has no body message to answer. Each
    try Envoy makes goes there: another replica does not hold the response."""
    async with picker(tiers=False) as (client, stub):
        replica = home_of(client, "resp_1")
        call = stub.Process()
        await call.write(request_headers(**{":method": "GET", ":path": "/v1/responses/resp_1"}))
        named = await call.read()
        await call.write(answer_headers("application/json"))
        answered = await call.read()
        call.cancel()
    assert named.WhichOneof("response") == "request_headers"
    lb = named.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields[DESTINATION]
    assert lb.string_value.split(",") == [replica.url.removeprefix("http://")] * (1 + FALLBACKS)
    mutation = answered.response_headers.response.header_mutation
    added = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    assert added["x-gateway-replica"] == replica.name
    assert added["x-gateway-route"] == "pinned"
    assert added["x-request-id"]


@pytest.mark.parametrize(
    ("method", "path", "key"),
    [
        ("GET", "/v1/responses/resp_acme", GLOBEX_KEY),
        ("POST", "/v1/responses/resp_acme/cancel", GLOBEX_KEY),
        ("GET", "/v1/responses/resp_unknown", ACME_KEY),
        ("GET", "/v1/responses/resp_unknown", None),  # no tenants: unknown is not found too
    ],
)
async def test_a_lookup_of_another_tenants_or_an_unknown_response_is_not_found(
    method: str, path: str, key: str | None
) -> None:
    """As `serve` answers it, before any replica is named."""
    limits = {"tenants": {"acme": tenant(ACME_KEY), "globex": tenant(GLOBEX_KEY)}}
    sent = {":method": method, ":path": path}
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    async with picker(tiers=False, limits=limits if key is not None else None) as (client, stub):
        home_of(client, "resp_acme", "acme")
        call = stub.Process()
        await call.write(request_headers(**sent))
        answer = await call.read()
        call.cancel()
    assert answer.immediate_response.status.code == 404
    error = orjson.loads(answer.immediate_response.body)["error"]
    assert error["param"] == "response_id"
    assert not answer.HasField("dynamic_metadata")
