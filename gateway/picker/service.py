"""Envoy's external-processing service: one gRPC stream per HTTP request Envoy relays.

For a completion request (a POST to one of the gateway's paths) the stream carries the
request's headers, then its whole body (Envoy buffers it: `request_body_mode: BUFFERED`), then
the answer's headers and body as they stream. The picker answers the body with the replica's
address, or with an immediate response for what the gateway refuses itself (400, 401, 429,
503); every other message is answered "go on" at once. A stored response's lookup (`GET
/v1/responses/{id}`, `POST /v1/responses/{id}/cancel`) is checked as `serve` checks it and sent
to the replica that stored the response, named in the answer to its headers. Any other request
goes on untouched, once its key passes where the policy has tenants: Envoy's load balancer picks
its replica (the fallback of `llm-gateway envoy-config`); its answer gets the request's id.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from typing import Any
from urllib.parse import unquote

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from multidict import CIMultiDict

from gateway import headers
from gateway.app_keys import LIFECYCLE, LIMITER, MEMORY, POLICY, SETTINGS
from gateway.http.body_read import declared_encoding, decode_body
from gateway.http.completions import complete, count_error
from gateway.http.errors import ApiError, internal_error
from gateway.http.request_body import Endpoint
from gateway.http.request_ids import request_id
from gateway.http.responses_lookup import pinned_headers, stored_home
from gateway.picker.exchange import Envoy, PickerExchange, endpoint_subset, go_on
from gateway.picker.picker import Picker
from gateway.telemetry.logs import REQUEST_ID

log = logging.getLogger(__name__)

_ENDPOINTS = {endpoint.value: endpoint for endpoint in Endpoint}
_LOOKUP = re.compile(r"/v1/responses/([^/]+)(/cancel)?")


def lookup_id(method: str, path: str) -> str | None:
    """The response id of a stored response's lookup (`GET /v1/responses/{id}`, `POST
    /v1/responses/{id}/cancel`: what `serve` relays to the replica that stored it, HEAD as
    GET as aiohttp routes it); None for any other request."""
    match = _LOOKUP.fullmatch(path)
    if match is None:
        return None
    cancel = match[2] is not None
    wanted = ("POST",) if cancel else ("GET", "HEAD")
    return match[1] if method in wanted else None


def header_map(message: Any) -> CIMultiDict[str]:
    """An ext_proc HeaderMap as the gateway's handlers read headers (names case-insensitive;
    Envoy sends the values as raw bytes)."""
    return CIMultiDict(
        # Decoded as `serve` decodes them (aiohttp's way): a tenant's key digests the same.
        (h.key, h.raw_value.decode(errors="surrogateescape") if h.raw_value else h.value)
        for h in message.headers
    )


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, app: web.Application, picker: Picker) -> None:
        self._app = app
        self._picker = picker

    async def Process(self, requests: Any, context: grpc.aio.ServicerContext) -> None:
        envoy = Envoy(context)
        inflight = self._app[LIFECYCLE].inflight
        task = asyncio.current_task()
        if task is not None:
            inflight.add(task)
        try:
            await self._process(envoy)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("picker stream failed")
        finally:
            if task is not None:
                inflight.discard(task)

    async def _process(self, envoy: Envoy) -> None:
        message = await envoy.read()
        if message is None:
            return
        if message.WhichOneof("request") != "request_headers":
            await envoy.pass_through(message)
            return
        sent = header_map(message.request_headers.headers)
        REQUEST_ID.set(request_id(sent))
        subset = endpoint_subset(message)
        # Read as the replica reads it: /v1/chat/%63ompletions is the chat path to vLLM, and
        # passed on unrouted it would generate with no key checked and no limit.
        path = unquote(sent.get(":path", "").split("?", 1)[0])
        method = sent.get(":method", "")
        response_id = lookup_id(method, path)
        if response_id is not None:
            exchange = PickerExchange(envoy, b"", subset)
            await self._look_up(exchange, path, sent, response_id)
            return
        endpoint = _ENDPOINTS.get(path)
        probe = method in ("GET", "HEAD") and not path.startswith("/v1/")
        if endpoint is None and not probe and not await self._key_passes(envoy, path, sent):
            return
        await envoy.write(go_on(message))
        bodiless = message.request_headers.end_of_stream
        if endpoint is None or method != "POST" or bodiless:
            # Not the picker's: its answer carries the request's id all the same, as `serve`'s.
            await envoy.until_answered({headers.REQUEST_ID: REQUEST_ID.get()})
            return
        body = await envoy.whole_body()
        if body is None:
            return
        started = time.perf_counter()
        exchange = PickerExchange(envoy, body, subset)
        app = self._app
        fleet = app[POLICY].fleet  # one generation of the policy for the whole request
        try:
            tenant = app[LIMITER].authenticate(fleet.policy.limits, sent)
            decoded = decode_body(body, declared_encoding(sent), app[SETTINGS].max_body_bytes)
            if decoded is not body:
                # Envoy forwards what the picker read: the replica (vLLM) does not decode.
                exchange.decoded, body = True, decoded
            forward = functools.partial(self._picker.forward, exchange)
            await complete(app, fleet, tenant, endpoint, sent, body, started, forward)
        except ApiError as error:
            await self._refuse(exchange, endpoint.value, error)
        except Exception:
            log.exception("unhandled error on POST %s", endpoint.value)
            await self._refuse(exchange, endpoint.value, internal_error())

    async def _key_passes(self, envoy: Envoy, path: str, sent: CIMultiDict[str]) -> bool:
        """Whether a request the picker does not route may go on: where the policy has tenants,
        it needs a tenant's key as much as a completion does (the model list, a stored
        response, a path vLLM serves and the gateway does not route; not a probe's GET of
        /health or /metrics); else a 401 answers it."""
        app = self._app
        try:
            app[LIMITER].authenticate(app[POLICY].fleet.policy.limits, sent)
        except ApiError as error:
            count_error(app, path, error.status)
            await PickerExchange(envoy, b"", None).refuse(error)
            return False
        return True

    async def _look_up(
        self,
        exchange: PickerExchange,
        path: str,
        sent: CIMultiDict[str],
        response_id: str,
    ) -> None:
        """A stored response's lookup, as `serve` answers it (gateway/http/responses_lookup.py):
        the key, the request limit and the owner checked, then sent to the replica that stored
        the response."""
        started = time.perf_counter()
        app = self._app
        fleet = app[POLICY].fleet
        try:
            pool, replica, limits = await stored_home(
                app[LIMITER], fleet, app[MEMORY].responses, sent, response_id
            )
            answer_headers = pinned_headers(pool, replica, limits)
            await self._picker.pin(exchange, pool, replica, answer_headers, started)
        except ApiError as error:
            await self._refuse(exchange, path, error)
        except Exception:
            log.exception("unhandled error on %s %s", sent.get(":method"), path)
            await self._refuse(exchange, path, internal_error())

    async def _refuse(self, exchange: PickerExchange, path: str, error: ApiError) -> None:
        if exchange.picked:
            return  # the replica is answering: the error only goes to the log
        count_error(self._app, path, error.status)
        await exchange.refuse(error)
