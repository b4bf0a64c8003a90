"""Which shared-state backend this process runs, decided once at start-up from two sources.

GATEWAY_REDIS_URL (and GATEWAY_STATE_KEY_PREFIX) take precedence over the policy's `state:`
section: a URL in the environment means Redis, as it always has, whatever the file says, so a
deployment that sets it (the Helm chart with several pods) keeps working with any policy. The
shared-state sync, the rate-limit buckets and the check of per-key limits under `--workers` all
read this one answer. Without Redis, the workers of one `serve --workers N` share between
themselves (gateway/shared_state/worker_mesh.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr

from gateway.settings import Settings
from router_policies.redis_url import mask
from router_policies.schema import Policy, StateBackend


class NoRedisUrl(ValueError):
    """The policy asks for the Redis backend and nothing says where Redis is."""


@dataclass(frozen=True, slots=True)
class BackendChoice:
    redis_url: SecretStr | None
    """None: the local backend."""
    key_prefix: str
    source: str
    """Where the URL came from, for the log line: the variable, or the policy file."""
    workers: int = 1

    @property
    def backend(self) -> StateBackend:
        return StateBackend.LOCAL if self.redis_url is None else StateBackend.REDIS

    def describe(self) -> str:
        """One line for logs, the password masked."""
        if self.redis_url is None and self.workers > 1:
            return (
                f"local: this instance's {self.workers} workers share with each other over "
                "Unix sockets (no Redis; other instances see none of it)"
            )
        if self.redis_url is None:
            return "local (each instance routes on what it has seen itself)"
        url = mask(self.redis_url.get_secret_value())
        return f"redis at {url} (key prefix {self.key_prefix!r}; from {self.source})"


def choose_backend(settings: Settings, policy: Policy) -> BackendChoice:
    """The backend, URL and key prefix in effect; raises NoRedisUrl."""
    state = policy.state
    prefix = settings.state_key_prefix or state.key_prefix
    workers = settings.workers
    if settings.redis_url is not None:
        return BackendChoice(settings.redis_url, prefix, "GATEWAY_REDIS_URL", workers)
    if state.backend is StateBackend.LOCAL:
        return BackendChoice(None, prefix, "the policy", workers)
    if state.redis_url is None:
        raise NoRedisUrl(
            "state.backend is redis but no Redis URL is set: set state.redis_url in the policy "
            "or GATEWAY_REDIS_URL"
        )
    return BackendChoice(state.redis_url, prefix, "the policy's state.redis_url", workers)


def startup_problem(settings: Settings, policy: Policy) -> str | None:
    """Why `serve` cannot start with this state configuration (one line), or None."""
    try:
        choice = choose_backend(settings, policy)
    except NoRedisUrl as exc:
        return str(exc)
    return limits_problem(choice, policy)


def limits_problem(choice: BackendChoice, policy: Policy) -> str | None:
    """Why ``policy``'s per-key limits cannot be enforced with this backend, or None: workers
    without Redis would each hold their own buckets, so N of them would let N times the limit
    through."""
    limited = any(
        t.requests_per_minute or t.tokens_per_minute for t in policy.limits.tenants.values()
    )
    if limited and choice.workers > 1 and choice.redis_url is None:
        return (
            f"per-key limits with {choice.workers} workers need the Redis state backend (each "
            "worker would otherwise allow the whole limit): set GATEWAY_REDIS_URL or the "
            "policy's state.redis_url"
        )
    return None


def policy_refusal(settings: Settings) -> Callable[[Policy], str | None]:
    """What a reload under ``settings`` asks of a new policy (PolicyHolder's ``refuse``)."""
    return lambda policy: limits_problem(choose_backend(settings, policy), policy)
