"""Which shared-state backend this process runs, decided once at start-up from two sources.

GATEWAY_REDIS_URL (and GATEWAY_STATE_KEY_PREFIX) take precedence over the policy's `state:`
section: a URL in the environment means Redis, as it always has, whatever the file says, so a
deployment that sets it (the Helm chart with several pods) keeps working with any policy. The
shared-state sync, the rate-limit buckets and the `--workers` check all read this one answer.
"""

from __future__ import annotations

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

    @property
    def backend(self) -> StateBackend:
        return StateBackend.LOCAL if self.redis_url is None else StateBackend.REDIS

    def describe(self) -> str:
        """One line for logs, the password masked."""
        if self.redis_url is None:
            return "local (each instance routes on what it has seen itself)"
        url = mask(self.redis_url.get_secret_value())
        return f"redis at {url} (key prefix {self.key_prefix!r}; from {self.source})"


def choose_backend(settings: Settings, policy: Policy) -> BackendChoice:
    """The backend, URL and key prefix in effect; raises NoRedisUrl."""
    state = policy.state
    prefix = settings.state_key_prefix or state.key_prefix
    if settings.redis_url is not None:
        return BackendChoice(settings.redis_url, prefix, "GATEWAY_REDIS_URL")
    if state.backend is StateBackend.LOCAL:
        return BackendChoice(None, prefix, "the policy")
    if state.redis_url is None:
        raise NoRedisUrl(
            "state.backend is redis but no Redis URL is set: set state.redis_url in the policy "
            "or GATEWAY_REDIS_URL"
        )
    return BackendChoice(state.redis_url, prefix, "the policy's state.redis_url")


def startup_problem(settings: Settings, policy: Policy) -> str | None:
    """Why `serve` cannot start with this state configuration (one line), or None."""
    try:
        choice = choose_backend(settings, policy)
    except NoRedisUrl as exc:
        return str(exc)
    if settings.workers > 1 and choice.backend is StateBackend.LOCAL:
        return (
            f"{settings.workers} workers need the Redis state backend: set GATEWAY_REDIS_URL "
            "or the policy's state.redis_url (worker processes share routing state through "
            "Redis; a redis-server on localhost will do)"
        )
    return None
