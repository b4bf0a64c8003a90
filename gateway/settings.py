"""Process settings, from GATEWAY_* environment variables; the one place their defaults live.

Routing behaviour lives in the policy file (router_policies/schema.py); these are the knobs
of the process itself. Where both set something (the Redis URL and key prefix), the
variable takes precedence: gateway/state_backend.py.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from router_policies.redis_url import checked as checked_redis_url
from router_policies.yaml_locations import error_at

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Settings(BaseSettings):
    # hide_input_in_errors: a bad GATEWAY_REDIS_URL must not print its password in an error.
    # allow_inf_nan: "inf" passes every lower bound, then breaks whatever turns it into a
    # deadline or a count (aiohttp's timeouts raise OverflowError at start-up).
    # env_ignore_empty: compose files and charts pass GATEWAY_X="" to mean unset.
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
        allow_inf_nan=False,
        env_ignore_empty=True,
    )

    host: str = "127.0.0.1"
    """Loopback unless an operator opens it up (0.0.0.0 in a container)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    policy: Path | None = None
    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    max_buffered_answer_bytes: Annotated[int, Field(ge=64 * 1024)] = 4 * 1024 * 1024
    """A replica's non-streaming answer up to this size is held whole (its usage and response
    id read, sent with its length); a longer one is relayed as it arrives, so no answer makes
    the gateway hold more than this per request."""
    max_json_depth: Annotated[int, Field(ge=2, le=200)] = 64
    """Deepest nesting of arrays and objects a body may have; checked before anything walks
    it (orjson cannot serialise past 254 levels, and recursion costs the event loop)."""
    stream_usage: bool = True
    """Ask a replica for the usage of a chat or completions stream whose client did not
    (`stream_options.include_usage`, which the OpenAI SDKs leave off) and drop that event from
    what the client gets: routing learns from every stream, and a tenant's token charge is
    corrected by it (gateway/relay/stream_usage.py). Off: such a stream teaches nothing."""
    retries: Annotated[int, Field(ge=0, le=10)] = 1
    """Extra attempts on another replica when one refuses or fails before the first byte."""
    connect_timeout_s: Annotated[float, Field(gt=0)] = 3.0
    first_token_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """A stream's wait for its first byte (queueing + prefill): past it the attempt fails and,
    since the client has received nothing yet, moves to another replica."""
    first_byte_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Longest silence from a replica otherwise: the gap between two chunks of a stream or of
    a non-streaming answer's body."""
    answer_timeout_s: Annotated[float, Field(gt=0)] = 1800.0
    """A non-streaming answer's wait for its headers, which vLLM sends with the body after the
    last token: this bounds the generation itself (32k tokens at 20 a second under load is
    27 min; vllm-router's and sglang-router's request timeout is 1800 s too). Past it the
    client gets 504 and the replica's request is aborted, neither retried (another replica
    would take as long) nor counted against the replica (slow is not broken)."""
    header_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """A client connection that has not sent complete request headers within this time
    (counted from its opening, or from the end of its previous response) is closed."""
    body_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Longest time to receive a request body once its headers are in."""
    send_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Longest a client may leave its answer unread (its socket full) before it counts as gone:
    its request then ends at the replica, freeing the batch slot and KV cache it held. As long
    as a replica's longest silence (first_byte_timeout_s), the bound a stalled stream had when
    the replica's silence was what ended it."""
    max_connections: Annotated[int, Field(ge=1)] = 2048
    """Open client connections; one more is answered 503 and closed. Also capped by the
    process's open-file limit (each request needs a client and a replica socket)."""
    worker_stuck_s: Annotated[float, Field(gt=0)] = 2.0
    """Under --workers N, a worker whose event loop has not run for this long is killed and
    replaced: stopped or wedged, it keeps its share of new connections and answers none. Four
    missed heartbeats (one every 0.5 s), far above any pause a healthy loop makes; at 3 s the
    fleet took 6 s to be back at 80% of one worker's throughput (`bench hang`)."""
    outlier_consecutive_failures: Annotated[int, Field(ge=1)] = 5
    """Consecutive 5xx answers, refused connections or first-token timeouts that eject a
    replica from routing."""
    outlier_base_ejection_s: Annotated[float, Field(gt=0)] = 10.0
    """First ejection's length; each further ejection without a success in between doubles it."""
    outlier_max_ejection_s: Annotated[float, Field(gt=0)] = 300.0
    outlier_max_ejected_share: Annotated[float, Field(ge=0, le=1)] = 0.5
    """At most this share of a pool's replicas is ejected at once (rounded down): failures
    that hit every replica are more likely the requests' fault than the replicas'."""
    shutdown_delay_s: Annotated[float, Field(ge=0)] = 5.0
    """After SIGTERM, /ready answers 503 at once but requests are still accepted this long,
    while load balancers (Kubernetes endpoints) stop sending new ones."""
    drain_timeout_s: Annotated[float, Field(ge=0)] = 45.0
    """Then in-flight requests get this long to finish; streams still open after it end with
    an SSE error event. Keep delay + drain below the pod's terminationGracePeriodSeconds."""
    health_interval_s: Annotated[float, Field(gt=0)] = 1.0
    health_timeout_s: Annotated[float, Field(gt=0)] = 1.0
    unhealthy_after: Annotated[int, Field(ge=1)] = 2
    healthy_after: Annotated[int, Field(ge=1)] = 2
    scrape_interval_s: Annotated[float, Field(gt=0)] = 1.0
    policy_watch_interval_s: Annotated[float, Field(gt=0)] = 1.0
    """How often the policy file is checked for changes (it is also reloaded on SIGHUP)."""
    admin_token: SecretStr | None = None
    """Bearer token for /admin/*; with none set (or an empty one), the admin endpoints are
    disabled."""
    log_level: str = "INFO"
    log_prompts: bool = False
    """Log each proxied request's conversation (its messages, prompt, input and instructions,
    up to gateway/http/completions.py's PROMPT_LOG_CHARS) at INFO with its request id, to see
    what a routing decision read. Off by default: prompts are the users' data."""
    otel: bool = False
    """OpenTelemetry traces of proxied requests (gateway/telemetry/tracing.py), sent
    over OTLP/HTTP as the standard OTEL_* variables say."""
    workers: Annotated[int, Field(ge=1, le=256)] = 1
    """Processes serving one port (SO_REUSEPORT). They share routing state through the Redis
    backend when one is configured, else with each other over Unix sockets. ``auto``: one per
    CPU this process may use (its CPU affinity, capped by a cgroup CPU limit, as a container's
    is): a worker is one event loop, and one loop uses at most one core."""
    redis_url: SecretStr | None = None
    """redis://[:password@]host:port/db: the shared-state backend of several instances
    (gateway/shared_state/). Set, it takes precedence over the policy's `state:` section (the
    backend is then Redis, at this URL); unset, the policy's `state:` decides (default local)."""
    state_key_prefix: str | None = None
    """Prefix of the Redis keys, over the policy's state.key_prefix (where its default lives)."""
    state_publish_interval_s: Annotated[float, Field(gt=0, le=1)] = 0.015
    """At most how often this instance's dispatches are published: the first after a quiet
    spell goes at once, then one batch per interval while they keep coming."""
    state_sync_interval_s: Annotated[float, Field(gt=0, le=5)] = 0.075
    """How often the in-flight, waiting and arrival counts are written and read."""
    state_ttl_s: Annotated[float, Field(gt=0)] = 2.0
    """An instance's counts expire this long after its last write (a dead instance)."""
    state_timeout_s: Annotated[float, Field(gt=0)] = 0.5
    """A Redis call slower than this counts as Redis down: routing goes on from local state."""
    rate_limit_lease_s: Annotated[float, Field(ge=0, le=10)] = 0.5
    """With Redis, each instance takes this many seconds of a tenant's refill at once and
    admits from it locally (gateway/rate_limit/leases.py): one Redis call per lease instead of
    two per request (the take and the usage correction), never more than the limit in all, at
    the price of up to this much of a tenant's rate held unspent by one instance. 0: every
    request asks Redis."""

    @field_validator("workers", mode="before")
    @classmethod
    def _auto_workers(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip().isdigit():
            if value.strip() != "auto":
                raise ValueError("a number of processes, or 'auto' (one per usable CPU)")
            return usable_cpus()
        return value

    @field_validator("port", mode="before")
    @classmethod
    def _empty_port_is_default(cls, port: object) -> object:
        # As for GATEWAY_HOST below: a compose file or chart passes GATEWAY_PORT="" for unset.
        if isinstance(port, str) and not port.strip():
            return cls.model_fields["port"].default
        return port

    @field_validator("host", mode="after")
    @classmethod
    def _empty_host_is_default(cls, host: str) -> str:
        # Compose files and charts pass GATEWAY_HOST="" to mean "unset", as for the token and
        # the Redis URL below; bound as is, "" would listen on every interface.
        host = host.strip()
        return host or str(cls.model_fields["host"].default)

    @field_validator("admin_token", mode="after")
    @classmethod
    def _empty_token_is_none(cls, token: SecretStr | None) -> SecretStr | None:
        # An empty token would accept an empty "Bearer " header: compose files and charts
        # pass GATEWAY_ADMIN_TOKEN="" to mean "off", so off it is. Clients' tokens arrive
        # stripped, so one stored with a final newline (a secret made from a file) could
        # never match.
        stripped = None if token is None else token.get_secret_value().strip()
        return SecretStr(stripped) if stripped else None

    @field_validator("redis_url", mode="after")
    @classmethod
    def _checked_url(cls, url: SecretStr | None) -> SecretStr | None:
        checked = None if url is None else checked_redis_url(url.get_secret_value())
        return None if checked is None else SecretStr(checked)

    @field_validator("log_level", mode="after")
    @classmethod
    def _known_level(cls, level: str) -> str:
        if level.upper() not in _LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(_LOG_LEVELS)}")
        return level.upper()

    @model_validator(mode="after")
    def _timeouts_agree(self) -> Settings:
        # At a field, and naming the other by its variable: an error at the model itself
        # named no variable ("settings: ..."), and the operator sets both as variables.
        if self.outlier_max_ejection_s < self.outlier_base_ejection_s:
            raise error_at(
                ("outlier_max_ejection_s",),
                f"must be at least {variable('outlier_base_ejection_s')}, which is "
                f"{self.outlier_base_ejection_s}",
                self.outlier_max_ejection_s,
            )
        if self.state_ttl_s < 2 * self.state_sync_interval_s:
            # Counts that expire between two writes vanish from every other instance's view.
            raise error_at(
                ("state_ttl_s",),
                f"must be at least twice {variable('state_sync_interval_s')}, which is "
                f"{self.state_sync_interval_s}",
                self.state_ttl_s,
            )
        return self


def variable(field: str) -> str:
    """The environment variable that sets ``field``."""
    return f"{Settings.model_config['env_prefix']}{field.upper()}"


def usable_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 CPU quota (a
    container's CPU limit, which the affinity does not show), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(0))
    else:
        cpus = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 CPU limit to read: the affinity alone
    return max(1, cpus)
