"""Serving a completion request, whichever server framed it: the front (gateway/http/front.py)
or aiohttp (gateway/http/app.py's handler, for the requests the front hands over).

Parse, resolve the pool (tiers, stored responses, adapters), admit (tenant limits), forward;
and the errors the gateway answers itself, in the OpenAI shape with the request's id.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from gateway import headers
from gateway.app_keys import (
    FORWARDER,
    LIFECYCLE,
    LIMITER,
    MEMORY,
    METRICS,
    POLICY,
    SETTINGS,
    TOKEN_KEYS,
)  # fmt: skip
from gateway.fleet.pools import Fleet
from gateway.http import responses_lookup
from gateway.http.errors import ApiError, WithHeaders, internal_error
from gateway.http.framed_request import Request
from gateway.http.front import FrontExchange
from gateway.http.request_body import Endpoint, parse_request
from gateway.http.request_ids import request_id
from gateway.rate_limit.limiter import Admission, RateLimiter, Tenant
from gateway.routing.affinity import RoutingMemory
from gateway.routing.client_hints import with_client_hints
from gateway.routing.resolve import Resolution, resolve
from gateway.routing.routed import CLIENT_CLOSED, Routed
from gateway.telemetry.logs import REQUEST_ID
from gateway.telemetry.metrics import NO_POOL

log = logging.getLogger(__name__)


async def complete(
    app: web.Application,
    fleet: Fleet,
    tenant: Tenant | None,
    endpoint: Endpoint,
    sent: Mapping[str, str],
    raw: bytes,
    started: float,
    forward: Callable[[Routed], Awaitable[int]],
) -> None:
    """Hands the request, with its pool and features, to ``forward`` (the proxy's, or the
    picker's); ``sent``: the client's headers. Raises ApiError for what it refuses."""
    settings = app[SETTINGS]
    parsed = parse_request(endpoint, raw, settings.max_json_depth)
    if settings.log_prompts:
        _log_prompt(endpoint, parsed.body)
    owner = tenant.name if tenant is not None else None
    memory = app[MEMORY]
    tenants = bool(fleet.policy.limits.tenants)
    if tenants:
        responses_lookup.refuse_chosen_id(parsed)
    if parsed.previous_response_id is not None:
        await responses_lookup.readable_home(
            memory.responses, parsed.previous_response_id, owner, "previous_response_id", tenants
        )
    await memory.large_conversations.recall(fleet.tiers.get(parsed.model), parsed.body)
    resolution = resolve(fleet, parsed, sent.get(headers.TIER), memory)
    pool = resolution.pool
    limiter = app[LIMITER]
    admission = None
    try:
        # Before the limits and the demand counts: a malformed hint is the client's error.
        features = with_client_hints(resolution.features, parsed.body, sent, pool.policy.session)
        if resolution.hooks is not None:
            resolution.hooks.owner = owner
        if tenant is not None:  # before arrivals: a 429 is not demand the pool must serve
            admission = await limiter.admit_request(tenant, fleet.policy.limits, resolution)
        pool.counts.arrivals += 1
        if pool.events_on:  # off, it costs nothing
            features = await app[TOKEN_KEYS].of(resolution, features)
        routed = Routed(
            resolution,
            features,
            REQUEST_ID.get(),
            started,
            {**resolution.response_headers(), **(admission.headers if admission else {})},
            on_usage=admission.observe if admission is not None else None,
            on_dispatch=_on_dispatch(admission, memory, resolution),
        )
        status = await forward(routed)
    except BaseException as exc:
        # The client left (the front cancels this task) or the request failed on the way:
        # settled all the same, by the usage seen if any, else by how it ended.
        if admission is not None:
            _settle_ended(limiter, admission, _ended_status(exc))
        if isinstance(exc, ApiError) and resolution.verdict is not None:
            # Refused once classified: it says its tier as a replica's answer does.
            raise WithHeaders(exc, resolution.response_headers()) from exc
        raise
    if admission is not None:
        limiter.settle(admission, status)


def _on_dispatch(
    admission: Admission | None, memory: RoutingMemory, resolution: Resolution
) -> Callable[[], None] | None:
    """What the request's going to a replica tells: the limits that its tokens may now be
    generated, and its tier's calibration and conversation memory its score, once. A request
    the gateway refuses (no healthy replica, shed, its wait timed out) is no traffic a pool
    served, and its client's retries would count it again: a large pool's outage would raise
    the threshold for after it."""
    tiers, verdict = resolution.tier_router, resolution.verdict
    # Generation only (the prefix-routed endpoints): a tokenizer or embeddings call is routed
    # by its score too, but is neither traffic the calibrated share is of nor a conversation's
    # turn, and would skew the threshold or mark a conversation large.
    if (
        tiers is None
        or verdict is None
        or verdict.forced
        or not resolution.parsed.endpoint.prefix_routed
    ):
        return admission.mark_sent if admission is not None else None
    observed = False

    def dispatched() -> None:
        nonlocal observed
        if admission is not None:
            admission.mark_sent()
        if not observed:
            observed = True
            sent_large = resolution.pool.name == tiers.settings.large
            if (went_large := tiers.observe(verdict, sent_large=sent_large)) is not None:
                memory.large_conversations.tell(tiers, went_large)

    return dispatched


def _ended_status(exc: BaseException) -> int:
    if isinstance(exc, ApiError):
        return exc.status
    if isinstance(exc, asyncio.CancelledError | ConnectionResetError):
        return CLIENT_CLOSED
    return HTTPStatus.INTERNAL_SERVER_ERROR


def _settle_ended(limiter: RateLimiter, admission: Admission, status: int) -> None:
    """Never raises: what ended the request (a cancellation above all) must go on up."""
    try:
        limiter.settle(admission, status)
    except Exception:
        log.exception("settling the rate limits of a request that ended early failed")


PROMPT_LOG_CHARS = 4096
"""How much of a conversation GATEWAY_LOG_PROMPTS logs: enough to see what routing read
(a system prompt's head, the turns), not a whole document per request."""
_PROMPT_FIELDS = ("instructions", "messages", "prompt", "input")


def _log_prompt(endpoint: Endpoint, body: Mapping[str, Any]) -> None:
    text = orjson.dumps({k: body[k] for k in _PROMPT_FIELDS if k in body}).decode()
    log.info("prompt on %s (%d chars): %s", endpoint.value, len(text), text[:PROMPT_LOG_CHARS])


def count_error(app: web.Application, path: str, status: int) -> None:
    """An error the gateway answered itself on an API path, counted without a pool."""
    if path.startswith(("/v1/", "/tokenize", "/detokenize")):
        app[METRICS].requests.labels(NO_POOL, NO_POOL, str(status)).inc()


async def serve_framed(app: web.Application, request: Request, exchange: FrontExchange) -> None:
    """A request the front framed, end to end: what the aiohttp middleware does for the
    others (the request's id in every log line, shutdown able to find it, errors answered)."""
    REQUEST_ID.set(request_id(request.headers))
    task = request.task
    inflight = app[LIFECYCLE].inflight
    if task is not None:
        inflight.add(task)
    try:
        fleet = app[POLICY].fleet  # one generation of the policy for the whole request
        tenant = app[LIMITER].authenticate(fleet.policy.limits, request.headers)
        forward = functools.partial(app[FORWARDER].forward, exchange)
        await complete(
            app, fleet, tenant, request.endpoint, request.headers, request.body, request.started,
            forward,
        )  # fmt: skip
    except ApiError as error:
        await _answer(app, request, exchange, error)
    except ConnectionResetError:
        raise  # the client is gone, or an answer broke off: the front closes the connection
    except Exception:
        log.exception("unhandled error on POST %s", request.endpoint.value)
        await _answer(app, request, exchange, internal_error())
    finally:
        if task is not None:
            inflight.discard(task)


async def _answer(
    app: web.Application, request: Request, exchange: FrontExchange, error: ApiError
) -> None:
    if exchange.started:
        raise ConnectionResetError("an answer has started: another would corrupt it")
    count_error(app, request.endpoint.value, error.status)
    hdrs = error.answer_headers({headers.REQUEST_ID: REQUEST_ID.get()})
    await exchange.answer(error.status, hdrs, error.body())
