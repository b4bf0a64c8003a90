"""One request's ext_proc stream, seen from the picker: Envoy's messages in, answers out.

Envoy waits for an answer to every message it sends (except in observability mode), so each
is answered at once; the picker's only real answers are to the request body (the replica, or
an immediate response), to the request headers of a stored response's lookup (its replica) and
to the answer's headers (the gateway's x-gateway-* headers, the request's id).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format, struct_pb2

from gateway import headers
from gateway.http.errors import ApiError
from gateway.picker.envoy_config import (
    DESTINATION,
    LB_NAMESPACE,
    MAX_RETRIES,
    SERVED,
    SUBSET,
    SUBSET_NAMESPACE,
)
from gateway.relay.stream_usage import UsageDropped
from gateway.routing.routed import CLIENT_CLOSED
from gateway.telemetry.logs import REQUEST_ID

_CONTINUE = {
    "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
    "response_headers": pb.ProcessingResponse(response_headers=pb.HeadersResponse()),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse()),
    "response_body": pb.ProcessingResponse(response_body=pb.BodyResponse()),
    "request_trailers": pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
    "response_trailers": pb.ProcessingResponse(response_trailers=pb.TrailersResponse()),
}


def go_on(message: Any) -> Any:
    """The answer that lets ``message`` through unchanged."""
    return _CONTINUE[message.WhichOneof("request")]


def _mutation(values: Mapping[str, str], remove: Sequence[str] = ()) -> Any:
    """Sets each header, replacing what the client (or the replica) sent under its name."""
    return pb.HeaderMutation(
        remove_headers=remove,
        set_headers=[
            core.HeaderValueOption(
                header=core.HeaderValue(key=k.lower(), raw_value=v.encode()),
                append_action=core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
            for k, v in values.items()
        ],
    )


def _headers_set(values: Mapping[str, str], remove: Sequence[str] = ()) -> Any:
    """The answer to the answer's headers that sets ``values`` on them."""
    mutation = _mutation(values, remove)
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
    )


def _destination(endpoints: Sequence[str]) -> tuple[dict[str, str], Any]:
    """The endpoints as the request's headers, and as Envoy's `envoy.lb` dynamic metadata
    (which its override_host policy reads). The list names the chosen replica again where
    the pool has too few (past it Envoy's fallback policy picks from every pool's replicas);
    Envoy's retries are cut to the distinct ones, as `serve` never retries a replica it tried
    (where Envoy refuses the header, it tries the chosen one again)."""
    value = ",".join(endpoints)
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION: value}})
    retries = str(len(set(endpoints)) - 1)
    return {DESTINATION: value, MAX_RETRIES: retries}, metadata


class Envoy:
    """The stream's two directions."""

    __slots__ = ("_context",)

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    async def read(self) -> Any | None:
        """Envoy's next message; None when the stream has ended."""
        message = await self._context.read()
        return None if message is grpc.aio.EOF else message

    async def write(self, response: Any) -> None:
        await self._context.write(response)

    async def pass_through(self, message: Any | None) -> None:
        """Lets ``message`` and every one after it through unchanged, to the stream's end."""
        while message is not None:
            await self.write(go_on(message))
            message = await self.read()

    async def until_answered(self, answer_headers: Mapping[str, str]) -> None:
        """Lets the request's messages through unchanged and sets ``answer_headers`` on the
        answer's headers; the stream ends there, and Envoy relays the rest of the answer
        without asking (it goes on alone once the picker has closed the stream)."""
        while (message := await self.read()) is not None:
            if message.WhichOneof("request") == "response_headers":
                await self.write(_headers_set(answer_headers))
                return
            await self.write(go_on(message))

    async def whole_body(self) -> bytes | None:
        """The request's body: one message when Envoy buffers it (`request_body_mode:
        BUFFERED`, which the pick needs: in a streamed mode Envoy has chosen the replica
        before the body comes), else gathered from its chunks. None when the stream ends
        first."""
        parts: list[bytes] = []
        while (message := await self.read()) is not None:
            kind = message.WhichOneof("request")
            if kind == "request_body":
                parts.append(message.request_body.body)
                if message.request_body.end_of_stream:
                    return b"".join(parts)
            elif kind == "request_trailers":
                return b"".join(parts)
            await self.write(go_on(message))
        return None


def _shown_part(chunk: Any, shown: UsageDropped) -> Any:
    """Envoy's answer to a chunk of a stream whose usage the gateway asked for: the chunk as it
    came where the client may see all of it, else what it may (the usage event dropped)."""
    part = shown(chunk.body)
    if chunk.end_of_stream:
        part += shown.rest()
    if part == chunk.body:
        return _CONTINUE["response_body"]
    mutation = pb.BodyMutation(body=part)
    return pb.ProcessingResponse(
        response_body=pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
    )


def endpoint_subset(message: Any) -> frozenset[str] | None:
    """The endpoints (ip:port) the proxy allows for this request, from the request headers'
    message; None when it names no subset."""
    hint = message.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET not in hint.fields:
        return None
    value = json_format.MessageToDict(hint)[SUBSET]
    items = value if isinstance(value, list) else str(value).split(",")
    return frozenset(str(item).strip() for item in items)


class PickerExchange:
    """The client's side of a request Envoy relays: either a refusal the gateway answers
    itself (an immediate response), or a pick, after which Envoy relays the replica's answer
    and the picker follows it."""

    __slots__ = ("_answer_headers", "_envoy", "decoded", "held", "picked", "subset")

    def __init__(self, envoy: Envoy, held: bytes, subset: frozenset[str] | None = None) -> None:
        self._envoy = envoy
        self.held = held
        """The request's body as Envoy holds it (the client's bytes): what the replica gets
        unless the pick sends another."""
        self.subset = subset
        """The endpoints (ip:port) the pick must be among, where the proxy named a subset."""
        self.picked = False
        self.decoded = False
        """Whether the gateway read the client's body decoded per its Content-Encoding: the
        replica (vLLM, which does not decode) gets it decoded, without that header."""
        self._answer_headers: Mapping[str, str] = {}

    async def refuse(self, error: ApiError) -> None:
        hdrs = error.answer_headers({headers.REQUEST_ID: REQUEST_ID.get()})
        hdrs["content-type"] = "application/json"
        await self._envoy.write(
            pb.ProcessingResponse(
                immediate_response=pb.ImmediateResponse(
                    status=http_status_pb2.HttpStatus(code=error.status),
                    headers=_mutation(hdrs),
                    body=error.body(),
                )
            )
        )

    async def pick(
        self, endpoints: Sequence[str], answer_headers: Mapping[str, str], body: bytes
    ) -> None:
        """Sends the request to ``endpoints[0]`` (ip:port), the others its fallbacks in turn,
        with ``body``, what `serve` would send (the body decoded, its model a tier's pool's,
        asking for a stream's usage); its answer will carry ``answer_headers``."""
        mutated, metadata = _destination(endpoints)
        # Envoy forwards the body it holds unless told otherwise: only a changed one travels
        # back (in the common case the same bytes object, which compares at no cost).
        replaced = body != self.held
        if replaced:
            mutated["content-length"] = str(len(body))
        # Whichever body goes, it is plain: vLLM would not decode it.
        removed = ("content-encoding",) if self.decoded else ()
        common = pb.CommonResponse(header_mutation=_mutation(mutated, removed))
        if replaced:
            common.body_mutation.body = body
        await self._envoy.write(
            pb.ProcessingResponse(
                request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata
            )
        )
        self.picked = True
        self._answer_headers = answer_headers

    async def pin(self, endpoints: Sequence[str], answer_headers: Mapping[str, str]) -> None:
        """Sends a request the picker routes by its headers alone (a stored response's lookup)
        to ``endpoints`` in turn: named in the answer to the request's headers, which is where
        the pick of a request without a body must be (Envoy sends no body message then), and
        which Envoy's load balancer reads as well after a body, if one comes."""
        mutated, metadata = _destination(endpoints)
        common = pb.CommonResponse(header_mutation=_mutation(mutated))
        await self._envoy.write(
            pb.ProcessingResponse(
                request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
            )
        )
        self.picked = True
        self._answer_headers = answer_headers

    async def follow(
        self,
        on_status: Callable[[int, Mapping[str, str]], Mapping[str, str]],
        on_chunk: Callable[[bytes], None],
        on_end: Callable[[int], None],
        shown: UsageDropped | None = None,
    ) -> None:
        """Answers Envoy's messages about the replica's answer until its end, then tells
        ``on_end`` its status, or CLIENT_CLOSED when the stream ended first (the client left,
        or Envoy gave up). ``on_status`` gets the status and the answer's headers (names lower
        case, Envoy's SERVED among them), and returns headers that replace answer headers of
        the pick; ``shown``, where the gateway asked for the stream's usage,
        is what of each chunk the client gets.

        The last message is taken in (its chunk, the end) before it is answered: once Envoy
        has the answer to the end of the stream it may close the stream at once, cancelling
        the write, and the answer's last chunk (its usage) and its status would be lost."""
        envoy = self._envoy
        status = CLIENT_CLOSED
        while (message := await envoy.read()) is not None:
            kind = message.WhichOneof("request")
            if kind == "response_headers":
                sent = message.response_headers.headers.headers
                values = {
                    h.key: (h.raw_value or h.value.encode()).decode(errors="replace") for h in sent
                }
                status = int(values.get(":status", "0") or 0)
                if "content-encoding" in values:
                    shown = None  # compressed: the usage cannot be read in it, nor dropped
                changed = on_status(status, values)
                if message.response_headers.end_of_stream:
                    on_end(status)
                await envoy.write(
                    _headers_set({**self._answer_headers, **changed}, remove=(SERVED,))
                )
                if message.response_headers.end_of_stream:
                    return
                continue
            if kind == "response_body" and shown is not None and status < 400:
                answer = _shown_part(message.response_body, shown)
            else:
                answer = go_on(message)
            ended = kind == "response_trailers"
            if kind == "response_body":
                on_chunk(message.response_body.body)
                ended = message.response_body.end_of_stream
            if ended:
                on_end(status)
            await envoy.write(answer)
            if ended:
                return
        on_end(CLIENT_CLOSED)
