"""The routing policy file: its schema, and the one place every routing default lives.

Operators edit YAML; everything the router reads comes out of these models, already
validated and with defaults filled in, so code never carries a second copy of a default.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from router_policies.adapter_placement import AdapterSettings
from router_policies.kv_events_settings import EventEndpoint, PrefixSource
from router_policies.limits_settings import LimitsSettings
from router_policies.policy_yaml import InvalidPolicy as InvalidPolicy
from router_policies.policy_yaml import read_validated
from router_policies.prefix_settings import PrefixSettings
from router_policies.redis_url import checked as checked_redis_url
from router_policies.redis_url import mask as mask_url
from router_policies.session_settings import SessionSettings
from router_policies.strict_model import StrictModel
from router_policies.tier_settings import POLICY_FOLDER, TierSettings
from router_policies.yaml_locations import FieldPath, Locations, error_at, errors_at


class PolicyName(StrEnum):
    PREFIX_AWARE = "prefix-aware"
    LEAST_LOADED = "least-loaded"
    ROUND_ROBIN = "round-robin"


class CostSettings(StrictModel):
    """The cost model's starting rates, used per replica until learned from observed TTFTs."""

    prefill_tokens_per_s: Annotated[float, Field(gt=0)] = 10000.0
    """Uncached prompt tokens a replica prefills per second."""
    step_s: Annotated[float, Field(ge=0)] = 0.01
    """Seconds of the engine step that emits the first token."""
    decode_s_per_seq: Annotated[float, Field(ge=0)] = 0.0002
    """Extra step seconds per sequence decoding in the same batch."""
    learn: bool = True
    """Learn each replica's rates online from the TTFTs the gateway observes."""
    min_samples: Annotated[int, Field(ge=1)] = 8
    """Observations before a replica's learned rates replace the defaults above."""
    forgetting: Annotated[float, Field(gt=0.5, le=1.0)] = 0.98
    """Weight kept by past observations at each new one (0.98: about the last 50 count)."""
    copy_weight: Annotated[float, Field(ge=0)] = 10.0
    """A replica's score is its predicted TTFT plus copy_weight x the prefill it would do beyond
    the warmest replica's: a cold copy costs more than this request's time. It costs the fleet
    that prefill, the room the copy takes on the cold replica (another conversation's history
    evicted), the room the history keeps on the warm one until it is evicted, and the next
    turns' hits, split between two copies. At 1 (this request's wait against the fleet's
    work alone), 27-59 requests a five-minute window of Mooncake's trace were sent cold away
    from their history when its replica had a prefill queue; over four runs on each tuning
    window, 10 kept 1.5-5 points more of the affinity bound than 4, with tails alike
    (docs/benchmarks.md, bench diagnose). 0: predicted TTFT alone."""
    ttft_objective_s: Annotated[float, Field(gt=0)] | None = None
    """The pool's TTFT objective. Set, a request predicted to miss it on every replica goes to
    the replica already furthest behind (under late_limit_s), so that the others stay within
    it: under overload, more requests meet the objective (goodput), the late ones wait longer.
    One whose own prefill alone misses it is routed as any. Unset: every request goes to its
    fastest replica."""
    late_limit_s: Annotated[float, Field(gt=0)] = 30.0
    """A late request is not sent where it is predicted to wait longer than this (keep it
    under the gateway's first-token timeout)."""
    near_s: Annotated[float, Field(ge=0)] = 0.005
    near_ratio: Annotated[float, Field(ge=0)] = 0.25
    """Replicas predicted within near_ratio x the fastest's TTFT + near_s count as equally
    fast, and the balance rule chooses among them: predictions carry errors (a learned rate
    moves with the machine's load), and a few milliseconds are not worth a hot spot."""


class LoadSettings(StrictModel):
    balance_eps: Annotated[float, Field(ge=0.0, le=10.0)] = 0.25
    """A hot prefix also fills the pool's least recently loaded replica when every replica
    holding it has had more than (1 + balance_eps) x as many recent dispatches (+ 1)."""
    recent_half_life_s: Annotated[float, Field(gt=0)] = 10.0
    """Half-life of the recent-dispatch counts the balance rule compares: long enough that a
    Poisson burst does not look like a hot spot."""


class HotPrefixSettings(StrictModel):
    """Hot prefixes are spread over k replicas: those holding them, then the least loaded."""

    spread_factor: Annotated[float, Field(ge=1.0)] = 1.25
    """k = ceil(share x replicas x spread_factor): no replica takes more than 1/spread_factor
    of a fair share of the pool's traffic from one prefix alone."""
    half_life_s: Annotated[float, Field(gt=0)] = 30.0
    """Half-life of the per-prefix (and per-session) request counts the share is taken from."""
    min_requests: Annotated[float, Field(ge=1)] = 64.0
    """Shares are taken over at least this many recent requests, so the first few requests of
    a new pool do not each look like the whole of its traffic."""


_MOST_REPLICAS = 2**31 - 1
"""Kubernetes keeps replica counts (the HPA's, a Deployment's) as int32; the desired count is
also exported as a float gauge, which a far larger int overflows."""


class AutoscaleSettings(StrictModel):
    """Inputs of gateway_pool_desired_replicas (see router_policies/autoscale.py)."""

    target_rate_per_replica: Annotated[float, Field(gt=0)] | None = None
    """Requests per second one replica should serve. The load term is (arrival rate + queue /
    backlog_drain_s) / this: proportional to load, so it settles on the right count. Unset,
    the gateway uses target_utilization x a capacity it estimates from each replica's learned
    rates and the pool's mean request (router_policies/capacity.py), replaced by the measured
    one (a replica's completions per second once the pool has stayed saturated for
    capacity_window_s). Only before the first estimate (about 8 completed requests) does the
    queue term below apply. The estimate can be well off (docs/scaling.md): set this for a
    predictable replica count."""
    target_utilization: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Share of a replica's learned capacity to run at when target_rate_per_replica is unset."""
    capacity_window_s: Annotated[float, Field(gt=0)] = 30.0
    """The pool must stay saturated (a request waiting per healthy replica) this long before its
    completion rate counts as its capacity. Until then the capacity is estimated from each
    replica's learned rates and the pool's mean prompt and output (router_policies/capacity.py)."""
    batch_slots: Annotated[int, Field(ge=1, le=1 << 20)] = 256
    """Sequences a replica's engine runs at once (vLLM --max-num-seqs), for the capacity
    estimate until the replica's queue shows its batch. Not scraped: vLLM does not export it.
    256 is vLLM's default on an A100 or a GPU under 70 GiB (1024 on an H100): a guess too low
    asks for a few more replicas (decode-bound capacity barely grows past it), and the measured
    saturation capacity replaces the estimate. At most 2^20, a thousand times any engine's
    batch (the figure is used as a float, which a far larger int overflows)."""
    backlog_drain_s: Annotated[float, Field(gt=0)] = 120.0
    """Time within which extra replicas should clear the waiting queue (rate term)."""
    rate_window_s: Annotated[float, Field(gt=0)] = 15.0
    """Window of the arrival rate. 15 s lets a step reach the signal within two 15 s scrapes;
    60 s lags by one more (docs/scaling.md); the scale-down stabiliser absorbs the noise."""
    target_queue_per_replica: Annotated[float, Field(gt=0)] = 4.0
    """Queue term (when no target rate is set): waiting requests per replica to run at; vLLM's
    production stack scales on an engine waiting queue of 5 per replica."""
    kv_usage_ceiling: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Mean KV-cache usage above which the pool needs more replicas even with no queue."""
    min_replicas: Annotated[int, Field(ge=0, le=_MOST_REPLICAS)] = 1
    max_replicas: Annotated[int, Field(ge=1, le=_MOST_REPLICAS)] = 64
    scale_down_stabilization_s: Annotated[float, Field(ge=0)] = 300.0
    """Scale down only to the highest recommendation of this trailing window (the HPA's
    default scale-down stabilisation is also 300 s)."""

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSettings:
        if self.min_replicas > self.max_replicas:
            raise error_at(
                ("min_replicas",),
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})",
                self.min_replicas,
            )
        return self


class PoolPolicy(StrictModel):
    model: Annotated[str, Field(min_length=1)]
    """The served model name clients ask for."""
    replicas: Annotated[list[str], Field(min_length=1)]
    """Base URLs of the pool's vLLM replicas, e.g. http://10.0.0.5:8000."""
    policy: PolicyName = PolicyName.PREFIX_AWARE
    adapters: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """LoRA adapters the replicas serve (vLLM's --lora-modules names): a request naming one
    goes to this pool, to the replicas that served the adapter lately (vLLM loads adapters on
    demand), and its prefix never matches another adapter's or the base model's."""
    adapter_placement: AdapterSettings = AdapterSettings()
    """How strongly an adapter's requests keep to the replicas that have it loaded."""
    tensor_parallel_size: Annotated[int, Field(ge=1)] = 1
    """GPUs per replica (2 for a 70B model on 80 GB GPUs). The gateway does not read it: it
    records the deployment's layout beside the pool (the Helm chart writes it from its launch
    recipe); vLLM's own --tensor-parallel-size is what splits the model."""
    max_inflight_per_replica: Annotated[int, Field(ge=1)] | None = None
    """Requests the gateway sends one replica at once; beyond it they wait in the gateway
    (counted in gateway_pool_gateway_waiting). None: no gateway-side limit."""
    queue_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Longest a request waits in the gateway for a replica slot before a 503."""
    saturation_queue_per_replica: Annotated[float, Field(gt=0)] = 8.0
    """Queue depth per healthy replica at which the pool counts as saturated (tier overflow)."""
    prefix: PrefixSettings = PrefixSettings()
    cost: CostSettings = CostSettings()
    load: LoadSettings = LoadSettings()
    hot: HotPrefixSettings = HotPrefixSettings()
    session: SessionSettings = SessionSettings()
    autoscale: AutoscaleSettings = AutoscaleSettings()

    @field_validator("replicas")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        cleaned = [u.strip().rstrip("/") for u in urls]
        for url in cleaned:
            scheme, sep, rest = url.partition("://")
            if not sep or scheme not in ("http", "https") or not rest or "/" in rest:
                # Masked: a URL with credentials must not show its password in the error.
                raise ValueError(f"{mask_url(url)!r} is not a base URL like http://host:port")
        # The gateway names a replica by its host:port (http://h:8000 and https://H:8000 alike);
        # credentials, refused later and never shown, are left out.
        names = [urlsplit(url).netloc.rpartition("@")[2].lower() for url in cleaned]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"a replica is listed twice: {', '.join(twice)}")
        return cleaned

    @model_validator(mode="after")
    def _events_published(self) -> PoolPolicy:
        events = self.prefix.events
        if self.prefix.source is PrefixSource.EVENTS:
            silent = [url for url in self.replicas if events.endpoint_for(url) is None]
            if silent:
                raise error_at(
                    ("prefix", "source"),
                    f"prefix.source is events, but no KV-event endpoint is set for {silent}: "
                    "set prefix.events.port or prefix.events.endpoints",
                    self.prefix.source.value,
                )
        unknown = sorted(set(events.endpoints) - set(self.replicas))
        if unknown:
            raise error_at(
                ("prefix", "events", "endpoints", unknown[0]),
                f"prefix.events.endpoints names replicas not in the pool: {unknown}",
                unknown[0],
            )
        return self

    def events_endpoint(self, url: str) -> EventEndpoint | None:
        """Where replica ``url`` publishes KV-cache events, if routing reads them."""
        if self.prefix.source is PrefixSource.ESTIMATE:
            return None
        return self.prefix.events.endpoint_for(url)


_HIDE_INPUT = ConfigDict(hide_input_in_errors=True)
"""For the models a Redis URL passes through: its password must not reach an error message as
pydantic's "input_value=..." (only the outermost model's setting counts, hence Policy's too).
Pydantic merges it into StrictModel's configuration, which these models keep."""


class StateBackend(StrEnum):
    LOCAL = "local"
    REDIS = "redis"


class StateSettings(StrictModel):
    """Where the routing state several gateway instances share lives (gateway/shared_state/).
    GATEWAY_REDIS_URL and GATEWAY_STATE_KEY_PREFIX, when set, take precedence. Read at start-up
    only: a reload that changes this section keeps the current one until a restart."""

    model_config = _HIDE_INPUT

    backend: StateBackend = StateBackend.LOCAL
    """`local`: each instance routes on what it has seen itself; `redis`: the instances share
    routing state and rate-limit buckets through Redis. Unset with a redis_url: `redis`."""
    redis_url: SecretStr | None = None
    """redis://[[user]:password@]host:port/db, rediss:// (TLS) or unix:///path/redis.sock;
    shown with its password masked (`***`) wherever the gateway prints the policy."""
    key_prefix: Annotated[str, Field(min_length=1)] = "llm-gateway"
    """Prefix of the Redis keys: gateways with different prefixes share nothing."""

    @model_validator(mode="before")
    @classmethod
    def _url_means_redis(cls, data: Any) -> Any:
        # Writing a URL and nothing else asks for Redis, as GATEWAY_REDIS_URL alone does.
        if isinstance(data, dict) and "backend" not in data and _given(data.get("redis_url")):
            return {**data, "backend": StateBackend.REDIS}
        return data

    @field_validator("redis_url", mode="before")
    @classmethod
    def _redis_url(cls, url: Any) -> Any:
        # Empty means no URL, as an empty GATEWAY_REDIS_URL does (a chart may render "").
        return checked_redis_url(url) if isinstance(url, str) else url

    @field_serializer("redis_url", when_used="json")
    def _masked(self, url: SecretStr | None) -> str | None:
        return None if url is None else mask_url(url.get_secret_value())


def _given(url: Any) -> bool:
    return url is not None and (not isinstance(url, str) or bool(url.strip()))


class Policy(StrictModel):
    model_config = _HIDE_INPUT

    pools: Annotated[dict[str, PoolPolicy], Field(min_length=1)]
    tiers: dict[str, TierSettings] = Field(default_factory=dict)
    """Virtual model names (e.g. `auto`) whose requests are classified into a pool."""
    limits: LimitsSettings = LimitsSettings()
    """Per-API-key rate limits (gateway/rate_limit/)."""
    state: StateSettings = StateSettings()
    """Shared state between gateway instances: `local` (default) or `redis`."""

    @model_validator(mode="after")
    def _one_pool_per_model(self) -> Policy:
        # Each at the key it is about, and all at once: the operator fixes them in one edit.
        problems: list[tuple[FieldPath, str, str]] = []
        owner: dict[str, str] = {}
        for name, pool in self.pools.items():
            if pool.model in owner:
                why = f"pool {owner[pool.model]!r} already serves model {pool.model!r}"
                why += ": a model has one pool (list every replica of it there)"
                problems.append((("pools", name, "model"), why, pool.model))
            owner.setdefault(pool.model, name)
        for name, pool in self.pools.items():
            for i, adapter in enumerate(pool.adapters):
                if adapter in owner:
                    why = f"adapter {adapter!r} is also pool {owner[adapter]!r}'s model or adapter"
                    problems.append((("pools", name, "adapters", i), why, adapter))
                owner.setdefault(adapter, name)
        for virtual, tier in self.tiers.items():
            if virtual in owner:
                why = f"tier model {virtual!r} is also pool {owner[virtual]!r}'s model or adapter"
                problems.append((("tiers", virtual), why, virtual))
            for role, pool_name in (("small", tier.small), ("large", tier.large)):
                if pool_name not in self.pools:
                    why = f"no pool named {pool_name!r}"
                    problems.append((("tiers", virtual, role), why, pool_name))
        if problems:
            raise errors_at(problems)
        return self


def parse_policy(data: Any) -> Policy:
    return Policy.model_validate(data)


def read_policy(text: str, folder: Path | None = None) -> tuple[Policy, Locations]:
    """The policy in a file's ``text``, and where its keys are (for the checks beyond the
    schema to name lines without parsing it again); raises InvalidPolicy. ``folder``: the
    file's, which relative paths in it are read from."""
    return read_validated(text, Policy, {POLICY_FOLDER: folder})


def load_policy(path: str | Path) -> Policy:
    """Reads and validates a policy file; raises OSError, UnicodeDecodeError, InvalidPolicy."""
    return read_policy(Path(path).read_text(encoding="utf-8"), Path(path).parent)[0]


def effective_policy_yaml(policy: Policy) -> str:
    """The policy with every default filled in, as operators would write it."""
    return yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False)
