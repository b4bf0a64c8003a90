"""The request handler's view of rate limits: authenticate, admit or refuse, settle.

- authenticate: with tenants in the policy, a completion request needs the bearer key of one
  (401 otherwise, unless ``allow_unknown_keys``); without tenants nothing is checked.
- admit: one request and the token estimate (prompt bytes / chars_per_token + max_tokens,
  x n) taken from the tenant's buckets, or a 429 with OpenAI's body and headers.
- settle: once the response is over, the estimate is corrected by the usage the replica
  reported (or refunded when the request failed with no usage), in the background.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from gateway import headers
from gateway.http.errors import ApiError, WithHeaders
from gateway.http.request_body import Endpoint, ParsedRequest
from gateway.rate_limit.keys import TenantIndex, bearer
from gateway.rate_limit.store import BucketStore
from gateway.routing.resolve import Resolution
from gateway.routing.routed import CLIENT_CLOSED
from router_policies.limits_settings import LimitsSettings, TenantLimits
from router_policies.rate_limit import BucketView, Limit, format_reset, needed, taken
from router_policies.value import value

REQUESTS, TOKENS = "requests", "tokens"
_ANSWER_BUDGETS = {
    Endpoint.CHAT: ("max_completion_tokens", "max_tokens"),
    Endpoint.COMPLETIONS: ("max_tokens",),
    Endpoint.RESPONSES: ("max_output_tokens",),
}
"""Where each generating endpoint's longest answer is, in the order vLLM reads them (a field
another endpoint uses is not one vLLM reads here)."""
_TOTAL_TOKENS = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
_HEADER_NAMES = {
    REQUESTS: (
        headers.RATELIMIT_LIMIT_REQUESTS,
        headers.RATELIMIT_REMAINING_REQUESTS,
        headers.RATELIMIT_RESET_REQUESTS,
    ),
    TOKENS: (
        headers.RATELIMIT_LIMIT_TOKENS,
        headers.RATELIMIT_REMAINING_TOKENS,
        headers.RATELIMIT_RESET_TOKENS,
    ),
}


@value
class Tenant:
    name: str
    limits: TenantLimits


class RateLimited(WithHeaders):
    """A 429 that carries its Retry-After and x-ratelimit-* headers through the error path."""

    def __init__(self, message: str, kind: str, extra_headers: dict[str, str]) -> None:
        # OpenAI's own 429s: type "requests" or "tokens", code "rate_limit_exceeded".
        super().__init__(
            ApiError(429, message, type_=kind, code="rate_limit_exceeded"), extra_headers
        )


@dataclass(slots=True)
class Admission:
    """An admitted request's charge, settled once its response is over."""

    tenant: str
    headers: dict[str, str]
    tokens_counted: Counter
    """The tenant's child of gateway_tenant_tokens_total."""
    tokens_charged: float = 0.0
    token_limit: Limit | None = None
    reported_tokens: int | None = None
    sent: bool = False
    """The request went to a replica (the client may then leave with tokens generated)."""

    def mark_sent(self) -> None:
        self.sent = True

    def observe(self, data: bytes) -> None:
        """Relayed bytes that carry `usage` (the proxy calls this where it finds one)."""
        found = _TOTAL_TOKENS.search(data)
        if found is not None:
            self.reported_tokens = int(found.group(1))


def _key(tenant: str, kind: str) -> str:
    # The braces are a Redis Cluster hash tag: one tenant's buckets share a slot, as the
    # script that takes from both at once needs.
    return f"{{{tenant}}}:{kind}"


def estimate_tokens(
    parsed: ParsedRequest, prompt_bytes: int, chars_per_token: float, default_completion: int
) -> float:
    """Prompt tokens from its bytes, plus the most the request may generate: its answer budget
    (parse_request has checked it is a count) for each choice of each prompt."""
    prompt = math.ceil(prompt_bytes / chars_per_token)
    fields = _ANSWER_BUDGETS.get(parsed.endpoint)
    if fields is None:
        return float(prompt)  # embeddings, scores, the tokenizer: nothing generated
    body = parsed.body
    completion = next((body[f] for f in fields if body.get(f) is not None), default_completion)
    n = body.get("n") if parsed.endpoint is not Endpoint.RESPONSES else 1
    choices = n if isinstance(n, int) and n > 0 else 1
    return float(prompt + completion * choices * _prompts(body))


def _prompts(body: Mapping[str, Any]) -> int:
    """How many prompts a body holds: a completions batch (a list of texts or of token lists)
    is answered once per prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def _headers(kinds: tuple[str, ...], views: tuple[BucketView, ...]) -> dict[str, str]:
    out = {}
    for kind, seen in zip(kinds, views, strict=True):
        limit, remaining, reset = _HEADER_NAMES[kind]
        out[limit] = str(int(seen.limit))
        out[remaining] = str(math.floor(seen.remaining))
        out[reset] = format_reset(seen.reset_s)
    return out


def _short(views: tuple[BucketView, ...], limits: tuple[Limit, ...], costs: list[float]) -> int:
    """Which bucket a refusal is for: the first that holds less than the request needs, else
    the one closest to it (the views come from the store's arithmetic, and a figure rounded
    on its way, as Redis's replies are, may show a bucket just short as just enough)."""
    gaps = [
        seen.remaining - needed(cost, lim)
        for seen, lim, cost in zip(views, limits, costs, strict=True)
    ]
    return next((i for i, gap in enumerate(gaps) if gap < 0), gaps.index(min(gaps)))


@dataclass(frozen=True, slots=True)
class _Plan:
    """A tenant's buckets as every request of it takes them."""

    limits_of: TenantLimits
    kinds: tuple[str, ...]
    limits: tuple[Limit, ...]
    keys: tuple[str, ...]
    token_limit: Limit | None
    admitted: Counter
    """The tenant's child of gateway_tenant_requests_total."""
    tokens_counted: Counter
    """The tenant's child of gateway_tenant_tokens_total."""

    @classmethod
    def of(cls, tenant: Tenant, requests: Counter, tokens: Counter) -> _Plan:
        chosen = [
            (kind, Limit(float(per_minute)))
            for kind, per_minute in (
                (REQUESTS, tenant.limits.requests_per_minute),
                (TOKENS, tenant.limits.tokens_per_minute),
            )
            if per_minute is not None
        ]
        by_kind = dict(chosen)
        return cls(
            tenant.limits,
            tuple(kind for kind, _ in chosen),
            tuple(limit for _, limit in chosen),
            tuple(_key(tenant.name, kind) for kind, _ in chosen),
            by_kind.get(TOKENS),
            requests.labels(tenant.name),
            tokens.labels(tenant.name),
        )


class RateLimiter:
    def __init__(
        self,
        store: BucketStore,
        requests: Counter,
        tokens: Counter,
        limited: Counter,
    ) -> None:
        self.store = store
        self._requests = requests
        self._tokens = tokens
        self._limited = limited
        self._index: TenantIndex | None = None
        self._plans: dict[str, _Plan] = {}
        self._settling: set[asyncio.Task[None]] = set()

    def authenticate(self, limits: LimitsSettings, sent: Mapping[str, str]) -> Tenant | None:
        """The request's tenant; None when the policy has none (or the key is allowed
        unknown); a 401 otherwise."""
        if not limits.tenants:
            return None
        index = self._index
        if index is None or index.limits is not limits:
            # Built once per policy generation: a reload brings a new LimitsSettings.
            index = self._index = TenantIndex(limits)
        key = bearer(sent)
        found = index.find(key) if key is not None else None
        if found is not None:
            return Tenant(*found)
        if limits.allow_unknown_keys:
            return None
        raise ApiError(
            401,
            "Incorrect API key provided."
            if key
            else "No API key provided: send 'Authorization: Bearer YOUR_KEY'.",
            type_="invalid_request_error",
            code="invalid_api_key",
        )

    async def admit_request(
        self, tenant: Tenant, limits: LimitsSettings, resolution: Resolution
    ) -> Admission:
        """admit() with the token estimate of a resolved request, in its pool's learned
        characters per token."""
        parsed = resolution.parsed
        generates = parsed.endpoint.prefix_routed
        prompt_bytes = resolution.features.hashed_bytes if generates else len(parsed.raw)
        tokens = estimate_tokens(
            parsed, prompt_bytes, resolution.pool.learned.chars_per_token,
            limits.completion_tokens_estimate,
        )  # fmt: skip
        return await self.admit(tenant, tokens)

    def _plan(self, tenant: Tenant) -> _Plan:
        plan = self._plans.get(tenant.name)
        if plan is None or plan.limits_of is not tenant.limits:
            # Once per tenant and policy generation: a reload brings new TenantLimits.
            plan = self._plans[tenant.name] = _Plan.of(tenant, self._requests, self._tokens)
        return plan

    async def admit(self, tenant: Tenant, tokens: float) -> Admission:
        """Take one request and ``tokens`` from the tenant's buckets, or raise a 429."""
        plan = self._plan(tenant)
        kinds, limits, token_limit = plan.kinds, plan.limits, plan.token_limit
        costs = [tokens if kind == TOKENS else 1.0 for kind in kinds]
        verdict = await self.store.take(plan.keys, limits, costs) if kinds else None
        counted = plan.tokens_counted
        if verdict is None:  # no limits, or the store did not answer (fail open)
            plan.admitted.inc()
            # Nothing was taken from a bucket: nothing to correct there once its usage is
            # known (a refund of what was never charged would refill the bucket).
            return Admission(tenant.name, {}, counted, tokens)
        out = _headers(kinds, verdict.views)
        if verdict.allowed:
            plan.admitted.inc()
            # What the bucket took: a cost past its debt's bound is not (so nor refunded).
            charged = tokens if token_limit is None else taken(tokens, token_limit)
            return Admission(tenant.name, out, counted, charged, token_limit)
        short = _short(verdict.views, limits, costs)
        kind = kinds[short]
        self._limited.labels(tenant.name, kind).inc()
        retry = max(verdict.retry_after_s, 0.001)
        out[headers.RETRY_AFTER] = str(math.ceil(retry))
        out[headers.RETRY_AFTER_MS] = str(math.ceil(retry * 1000))
        unit = "requests" if kind == REQUESTS else "tokens"
        raise RateLimited(
            f"Rate limit reached for tenant {tenant.name!r} on {unit} per minute: "
            f"limit {int(limits[short].per_minute)}, "
            f"remaining {math.floor(verdict.views[short].remaining)}, "
            f"requested {math.ceil(costs[short])}. Please try again in {format_reset(retry)}.",
            kind,
            out,
        )

    def settle(self, admission: Admission, status: int) -> None:
        """Counts the tokens and corrects the estimate, off the request path."""
        charged = admission.tokens_charged
        if admission.reported_tokens is not None:
            used = float(admission.reported_tokens)
        elif status >= 400 and not (status == CLIENT_CLOSED and admission.sent):
            used = 0.0  # nothing was generated (a client that left while queued too): a refund
        else:
            # No usage reported: a stream without include_usage, or a client that left once its
            # request had gone to a replica, whose tokens may well have been generated: a refund
            # would make leaving just before the usage event a way round the limit.
            used = charged
        admission.tokens_counted.inc(used)
        limit = admission.token_limit
        if limit is None or used == charged:
            return
        key = _key(admission.tenant, TOKENS)
        if self.store.adjust_now(key, limit, used - charged):
            return
        task = asyncio.create_task(self.store.adjust(key, limit, used - charged))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def settled(self) -> None:
        """Waits for the corrections still being written (shutdown, tests)."""
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)

    async def close(self) -> None:
        await self.settled()
        await self.store.close()
