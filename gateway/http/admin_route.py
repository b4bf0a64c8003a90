"""`POST /admin/route`: the decision a request would get, without sending it, and why."""

from __future__ import annotations

import contextlib
import math

import orjson
from aiohttp import web

from gateway import headers
from gateway.app_keys import MEMORY, POLICY, SETTINGS, TOKEN_KEYS
from gateway.http.body_read import read_body
from gateway.http.errors import ApiError
from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.affinity import HomesUnavailable
from gateway.routing.client_hints import with_client_hints
from gateway.routing.explain import comparison_view, explain
from gateway.routing.resolve import resolve


async def admin_route(request: web.Request) -> web.Response:
    """The decision a request would get, without sending it: for operators tuning weights."""
    try:
        endpoint = Endpoint(request.query.get("endpoint", Endpoint.CHAT.value))
    except ValueError:
        raise ApiError(400, "'endpoint' must be a completion path.", param="endpoint") from None
    settings = request.app[SETTINGS]
    raw = await read_body(request, settings.body_timeout_s)
    parsed = parse_request(endpoint, raw, settings.max_json_depth)
    memory, fleet = request.app[MEMORY], request.app[POLICY].fleet
    if parsed.previous_response_id is not None:
        with contextlib.suppress(HomesUnavailable):  # the dry run routes it unpinned then
            await memory.responses.find(parsed.previous_response_id)  # another process's
    await memory.large_conversations.recall(fleet.tiers.get(parsed.model), parsed.body)
    resolution = resolve(fleet, parsed, request.headers.get(headers.TIER), memory)
    # As a dispatch would: a stored response's replica, or an adapter's warm replicas.
    hooks = resolution.hooks
    exclude = hooks.exclude(resolution.pool.replicas, [], 0) if hooks is not None else ()
    pool = resolution.pool
    features = with_client_hints(
        resolution.features, parsed.body, request.headers, pool.policy.session
    )
    if pool.events_on:
        features = await request.app[TOKEN_KEYS].of(resolution, features)
    decision = pool.decide(features, exclude, explain=True)
    tier = None
    if resolution.verdict is not None:
        verdict = resolution.verdict
        threshold = verdict.threshold
        tier = {
            "tier": verdict.tier.value,
            "classifier": verdict.score.classifier,
            "score": verdict.score.score,
            # JSON has no infinity (orjson writes null): calibrated to a target share of 0 or 1
            # it is +-inf, written "inf" or "-inf" as the metric's exposition says +Inf.
            "threshold": threshold if math.isfinite(threshold) else str(threshold),
            "forced": verdict.forced,
            "kept_by_conversation": verdict.kept,
            "kept_by_stored_response": resolution.choice is not None and resolution.choice.stored,
            "features": dict(verdict.score.features),
            "contributions": dict(verdict.score.contributions),
            **comparison_view(resolution.compared, resolution.compared_for),
        }
    route = resolution.answer_route(decision.route) if decision else resolution.route
    return web.Response(
        content_type="application/json",
        body=orjson.dumps(
            {
                "model": parsed.model,
                "tier": tier,
                "pool": resolution.pool.name,
                "replica": decision.replica if decision else None,
                "route": route.value if route else None,
                "matched_blocks": decision.matched_blocks if decision else 0,
                "fingerprint_blocks": len(resolution.features.block_hashes),
                "chars_per_token": round(resolution.pool.learned.chars_per_token, 3),
                **explain(decision),
            }
        ),
    )
