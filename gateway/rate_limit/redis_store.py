"""Token buckets in Redis, shared by every gateway instance, updated by one Lua script.

The script runs the rules of router_policies/rate_limit.py (the same table of cases tests
both) atomically on the server, on the server's clock (TIME), so instances with skewed clocks
still agree. A bucket is a hash {used, at, size, until} that expires once it would be full
again: an absent bucket is a full one, and idle tenants cost no memory. ``size`` and ``until``
keep a lowered limit's debt while instances disagree on the limit (store.py's _rate_of).

Redis down or slower than the timeout (or refusing the password, the certificate, writes):
the request is served (fail open), one warning saying which is logged per outage, each
failure is counted in gateway_rate_limit_backend_errors_total, and Redis is not tried again
for ``retry_s`` so that an outage adds no latency to every request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.shared_state.redis_errors import FAILURES, describe
from router_policies.rate_limit import Bucket, Limit, Verdict, view
from router_policies.schema import StateSettings

log = logging.getLogger(__name__)

# KEYS: the buckets. ARGV[1]: "take" or "adjust"; then per bucket: size per minute, cost, how
# much more to lease when the cost is admitted (as much of it as the bucket still holds), and
# what the caller returns of its previous lease. A bucket is {used, at}, as in
# router_policies/rate_limit.py, and {size, until}: the smallest size asked of it and the time
# the bucket will be full at that size's rate (see _rate_of in store.py, the same rule).
# Returns {allowed (1/0), retry_after_s, used of each bucket after, leased of each}, as
# strings (Redis truncates Lua numbers).
_SCRIPT = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = #KEYS
local sizes, costs, extras, used, leased, rates, smallest = {}, {}, {}, {}, {}, {}, {}
local function fmt(x) return string.format('%.6f', x) end
local function store(i)
  redis.call('HSET', KEYS[i], 'used', fmt(used[i]), 'at', fmt(now))
  if smallest[i] then
    redis.call('HSET', KEYS[i], 'size', fmt(sizes[i]),
               'until', fmt(now + used[i] / (sizes[i] / 60)))
  end
  -- Gone once full again, at the rate it refills: an absent bucket is a full one.
  redis.call('PEXPIRE', KEYS[i], math.ceil(used[i] / (rates[i] / 60) * 1000) + 1000)
end
for i = 1, n do
  sizes[i] = tonumber(ARGV[4 * i - 2])
  costs[i] = tonumber(ARGV[4 * i - 1])
  extras[i] = tonumber(ARGV[4 * i])
  leased[i] = 0
  local state = redis.call('HMGET', KEYS[i], 'used', 'at', 'size', 'until')
  -- A smaller size asked by another instance (one that has reloaded a lowered limit while
  -- this one has not) refills the bucket until it is full at that rate: refilled at this
  -- caller's larger rate, or expired by it, the lowered limit's debt would be gone.
  local held = tonumber(state[3])
  rates[i] = sizes[i]
  if held and held < sizes[i] and now < tonumber(state[4]) then rates[i] = held end
  smallest[i] = rates[i] == sizes[i]
  used[i] = 0
  if state[1] and state[2] then
    local elapsed = math.max(now - tonumber(state[2]), 0)
    local owed = math.max(tonumber(state[1]) - elapsed * rates[i] / 60, 0)
    used[i] = math.min(owed, 2 * sizes[i])
    -- Used under a larger size (a limit lowered since): kept at the bound, and the TTL with
    -- it, even when this call is refused; so is a smaller size the bucket did not hold.
    if used[i] < owed or (smallest[i] and held ~= sizes[i]) then store(i) end
  end
  -- The unspent lease comes back before the decision, never past a full bucket (as the
  -- local store's refill): the instance's view and the decision are then the same bucket.
  used[i] = math.max(used[i] - tonumber(ARGV[4 * i + 1]), 0)
end
if ARGV[1] == 'adjust' then
  used[1] = math.min(math.max(used[1] + costs[1], 0), 2 * sizes[1])
  store(1)
  return {'1', '0', string.format('%.6f', used[1]), '0'}
end
local retry = 0
for i = 1, n do
  local need = math.min(costs[i], sizes[i])
  local level = sizes[i] - used[i]
  if need > 0 and level < need then
    retry = math.max(retry, (need - level) / (sizes[i] / 60))
  end
end
if retry == 0 then
  for i = 1, n do
    used[i] = math.min(math.max(used[i] + costs[i], 0), 2 * sizes[i])
    leased[i] = math.max(math.min(extras[i], sizes[i] - used[i]), 0)
    used[i] = used[i] + leased[i]
    store(i)
  end
end
local out = {retry == 0 and '1' or '0', string.format('%.6f', retry)}
for i = 1, n do out[#out + 1] = string.format('%.6f', used[i]) end
for i = 1, n do out[#out + 1] = string.format('%.6f', leased[i]) end
return out
"""


class RedisStore:
    backend = "redis"

    def __init__(
        self,
        url: str,
        errors: Counter,
        *,
        key_prefix: str = StateSettings().key_prefix,
        timeout_s: float = 0.5,
        retry_s: float = 1.0,
    ) -> None:
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # One immediate retry on a broken connection (a pooled one Redis closed on a
            # restart), none on a timeout: the request waits at most one timeout.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._script = self._client.register_script(_SCRIPT)
        self._prefix = f"{key_prefix}:ratelimit:"
        self._errors = errors
        self.timeout_s = timeout_s
        self._retry_s = retry_s
        self._down_until = 0.0
        self._down = False

    async def take(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Verdict | None:
        none = [0.0] * len(keys)
        taken = await self.take_leasing(keys, limits, costs, none, none)
        return taken[0] if taken is not None else None

    async def take_leasing(
        self,
        keys: Sequence[str],
        limits: Sequence[Limit],
        costs: Sequence[float],
        extras: Sequence[float],
        returned: Sequence[float],
    ) -> tuple[Verdict, tuple[float, ...]] | None:
        """take(), and when admitted up to ``extras[i]`` more from bucket i, as much as it
        still holds: the verdict (its buckets count what was leased as used) and what each
        bucket leased. ``returned[i]``: the unspent part of the caller's previous lease of
        bucket i, back in the bucket before the decision, and given back only when admitted
        (when refused, the verdict's views count it, though the caller keeps it)."""
        args: list[str | float] = ["take"]
        for limit, cost, extra, back in zip(limits, costs, extras, returned, strict=True):
            args += [limit.per_minute, cost, extra, back]
        reply = await self._run(keys, args, check=True)
        if reply is None:
            return None
        allowed, retry, *figures = (float(v) for v in reply)
        buckets = tuple(Bucket(u, 0.0) for u in figures[: len(keys)])
        views = tuple(view(b, lim) for b, lim in zip(buckets, limits, strict=True))
        return Verdict(allowed == 1.0, buckets, views, retry), tuple(figures[len(keys) :])

    async def adjust(self, key: str, limit: Limit, delta: float) -> None:
        await self._run([key], ["adjust", limit.per_minute, delta, 0.0, 0.0])

    def adjust_now(self, key: str, limit: Limit, delta: float) -> bool:
        return False  # always a round trip

    async def _run(
        self, keys: Sequence[str], args: list[str | float], *, check: bool = False
    ) -> list[bytes] | None:
        """The script's reply, None when Redis does not answer: for a ``check`` (a take, not
        a usage correction), a request served unlimited, which the errors metric counts."""
        if self._down and time.monotonic() < self._down_until:
            if check:
                self._errors.inc()
            return None
        try:
            reply: list[bytes] = await self._script(
                keys=[self._prefix + k for k in keys], args=args
            )
        except FAILURES as exc:
            if check:
                self._errors.inc()
            self._down_until = time.monotonic() + self._retry_s
            if not self._down:
                self._down = True
                # A wrong password or an untrusted certificate fails open too, until fixed:
                # the line says which, not "unreachable".
                log.warning(
                    "rate limits: Redis %s; serving without limits until it answers again",
                    describe(exc),
                )
            return None
        if self._down:
            self._down = False
            log.info("rate limits: Redis answers again; limits are enforced")
        return reply

    async def close(self) -> None:
        await self._client.aclose()
