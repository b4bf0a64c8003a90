"""The policy's `state:` section: where the state gateway instances share lives (`local`, the
default, or `redis`), how it combines with GATEWAY_REDIS_URL and GATEWAY_STATE_KEY_PREFIX (the
variables win), that a Redis password is never shown, and that a reload cannot switch it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
import yaml
from pydantic import SecretStr, ValidationError

from bench.launcher import GatewayProcess, start_gateway
from gateway.policy.reload import STATE_NEEDS_RESTART
from gateway.settings import Settings
from gateway.state_backend import NoRedisUrl, choose_backend, policy_refusal, startup_problem
from replica.processes import ManagedProcess
from router_policies.redis_url import mask
from router_policies.schema import (
    InvalidPolicy,
    Policy,
    StateBackend,
    effective_policy_yaml,
    load_policy,
    parse_policy,
)
from tests.conftest import (
    FAST_PROBES,
    eventually,
    metric_sum,
    policy_holder,
    pool_policy,
    running_sims,
)
from tests.redis_server import RedisServer, running_redis

POOLS = pool_policy(["http://127.0.0.1:9101"])
SECRET = "hunter2-not-for-logs"
FILE_URL = f"redis://:{SECRET}@file-cache:6379/0"
ENV_URL = "redis://:env-password@env-cache:6379/1"


def policy(**state: Any) -> Policy:
    return parse_policy({**POOLS, "state": state})


def url_of(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


# -- the section ---------------------------------------------------------------------------------


def test_local_is_the_default_and_the_key_prefix_is_the_one_redis_used_before() -> None:
    state = parse_policy(POOLS).state
    assert (state.backend, state.redis_url, state.key_prefix) == (
        StateBackend.LOCAL, None, "llm-gateway",
    )  # fmt: skip


def test_a_redis_url_alone_asks_for_the_redis_backend() -> None:
    assert policy(redis_url=FILE_URL).state.backend is StateBackend.REDIS


def test_an_explicit_local_backend_leaves_a_url_unused() -> None:
    choice = choose_backend(Settings(), policy(backend="local", redis_url=FILE_URL))
    assert (choice.backend, choice.redis_url) == (StateBackend.LOCAL, None)


def test_an_empty_redis_url_is_no_url() -> None:
    assert policy(redis_url="  ").state == parse_policy(POOLS).state


@pytest.mark.parametrize(
    "url",
    [
        "redis://:pw@cache:6379/0",
        "rediss://app:pw@cache.example:6380",
        "redis://[::1]:6379",
        "unix:///run/redis.sock?db=1",
    ],
)
def test_redis_and_socket_urls_are_accepted(url: str) -> None:
    assert url_of(policy(redis_url=url).state.redis_url) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://cache:6379", "must start with redis://, rediss:// (TLS) or unix://"),
        ("redis://cache:port", "is not a valid URL"),
        ("redis:///0", "has no host"),
        ("redis://cache:6379/zero", "the path must be a database number"),
        ("unix://", "names no socket"),
        # redis-py would read it over GATEWAY_STATE_TIMEOUT_S: a hung Redis holds requests.
        ("redis://cache:6379/0?socket_timeout=8", "would override GATEWAY_STATE_TIMEOUT_S"),
        ("unix:///run/redis.sock?socket_connect_timeout=9", "socket_connect_timeout in the URL"),
        ("redis://cache/0?retry_on_timeout=true", "retry_on_timeout in the URL"),
    ],
)
def test_a_url_redis_cannot_use_is_refused_with_its_line(
    tmp_path: Path, url: str, why: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "pools:\n  small:\n    model: m\n    replicas: [http://127.0.0.1:9101]\n"
        f"state:\n  redis_url: '{url}'\n"
    )
    with pytest.raises(InvalidPolicy) as refused:
        load_policy(path)
    [problem] = refused.value.problems
    assert problem.startswith("line 6: state.redis_url: ") and why in problem


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://app:hunter2@cache:6379/0", "redis://app:***@cache:6379/0"),
        # No colon: redis-py reads a user name, but it may well be a password.
        ("redis://hunter2@cache:6379", "redis://***@cache:6379"),
        ("redis://:hun@ter/2@cache:6379", "redis://:***@cache:6379"),
        (
            "unix:///run/redis.sock?db=0&password=hunter2",
            "unix:///run/redis.sock?db=0&password=***",
        ),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
    ],
)
def test_a_shown_url_has_its_password_masked(url: str, shown: str) -> None:
    assert mask(url) == shown


def test_the_password_is_masked_wherever_the_policy_is_printed() -> None:
    loaded = policy(redis_url=FILE_URL)
    masked = "redis://:***@file-cache:6379/0"
    assert SECRET not in repr(loaded)
    # check-policy prints effective_policy_yaml; /admin/policy the same JSON dump.
    assert f"redis_url: {masked}" in effective_policy_yaml(loaded)
    assert loaded.model_dump(mode="json")["state"]["redis_url"] == masked
    assert url_of(loaded.state.redis_url) == FILE_URL  # the gateway itself still has it


def test_the_password_is_in_no_validation_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError) as in_file:
        policy(redis_url=f"http://:{SECRET}@cache:6379")
    monkeypatch.setenv("GATEWAY_REDIS_URL", f"http://:{SECRET}@cache:6379")
    with pytest.raises(ValidationError) as in_env:
        Settings()
    for refused in (in_file.value, in_env.value):
        assert "'http://:***@cache:6379' must start with redis://" in str(refused)
        assert SECRET not in str(refused)


@pytest.mark.parametrize("mark", ["/", "?", "#"])
def test_a_password_with_a_mark_that_ends_a_urls_host_is_refused_unquoted(
    mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parsed, its host would end at the mark, and the parser's error quote the password's rest.
    url = f"redis://:{SECRET[:4]}{mark}{SECRET[4:]}@cache:6379/0"
    with pytest.raises(ValidationError) as in_file:
        policy(redis_url=url)
    monkeypatch.setenv("GATEWAY_REDIS_URL", url)
    with pytest.raises(ValidationError) as in_env:
        Settings()
    for refused in (in_file.value, in_env.value):
        assert "percent-encode '/', '?' and '#' in the password" in str(refused)
        assert SECRET[:4] not in str(refused) and SECRET[4:] not in str(refused)


# -- precedence: the variables over the file -----------------------------------------------------


def test_gateway_redis_url_takes_precedence_over_the_file() -> None:
    choice = choose_backend(Settings(redis_url=SecretStr(ENV_URL)), policy(redis_url=FILE_URL))
    assert (choice.backend, url_of(choice.redis_url)) == (StateBackend.REDIS, ENV_URL)


@pytest.mark.parametrize("state", [{}, {"backend": "local"}])
def test_gateway_redis_url_means_redis_whatever_the_file_says(state: dict[str, str]) -> None:
    choice = choose_backend(Settings(redis_url=SecretStr(ENV_URL)), policy(**state))
    assert (choice.backend, url_of(choice.redis_url)) == (StateBackend.REDIS, ENV_URL)


def test_without_the_variable_the_file_decides() -> None:
    choice = choose_backend(Settings(), policy(redis_url=FILE_URL))
    assert (choice.backend, url_of(choice.redis_url)) == (StateBackend.REDIS, FILE_URL)


def test_gateway_state_key_prefix_takes_precedence_over_the_file() -> None:
    in_file = policy(redis_url=FILE_URL, key_prefix="from-file")
    assert choose_backend(Settings(), in_file).key_prefix == "from-file"
    assert choose_backend(Settings(state_key_prefix="from-env"), in_file).key_prefix == "from-env"


def test_the_redis_backend_without_any_url_is_refused() -> None:
    with pytest.raises(
        NoRedisUrl, match=r"set state\.redis_url in the policy or GATEWAY_REDIS_URL"
    ):
        choose_backend(Settings(), policy(backend="redis"))
    supplied = choose_backend(Settings(redis_url=SecretStr(ENV_URL)), policy(backend="redis"))
    assert url_of(supplied.redis_url) == ENV_URL


LIMITED = {"tenants": {"acme": {"api_key_sha256": ["ab" * 32], "requests_per_minute": 60}}}


def limited(**state: Any) -> Policy:
    return parse_policy({**POOLS, "limits": LIMITED, "state": state})


def test_several_workers_run_without_redis_but_per_key_limits_need_it() -> None:
    # Each worker would hold its own buckets: two of them would let twice the limit through.
    assert startup_problem(Settings(workers=2), parse_policy(POOLS)) is None
    assert "GATEWAY_REDIS_URL" in (startup_problem(Settings(workers=2), limited()) or "")
    assert startup_problem(Settings(workers=2, redis_url=SecretStr(ENV_URL)), limited()) is None
    assert startup_problem(Settings(workers=2), limited(redis_url=FILE_URL)) is None
    assert startup_problem(Settings(workers=1), limited()) is None
    # Tenants without limits only authenticate: nothing to share.
    keys_only = {"tenants": {"acme": {"api_key_sha256": ["ab" * 32]}}}
    assert (
        startup_problem(Settings(workers=2), parse_policy({**POOLS, "limits": keys_only})) is None
    )


# -- the command line ----------------------------------------------------------------------------


def llm_gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI with no GATEWAY_* variable but those in ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True, text=True, timeout=60, env={**clean, **(env or {})},
    )  # fmt: skip


def policy_file(tmp_path: Path, **state: Any) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**POOLS, "state": state}))
    return str(path)


def test_check_policy_refuses_the_redis_backend_without_a_url_in_one_line(tmp_path: Path) -> None:
    result = llm_gateway("check-policy", policy_file(tmp_path, backend="redis"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: state.backend is redis but no Redis URL is set: set state.redis_url in the "
        "policy or GATEWAY_REDIS_URL"
    ]


def test_check_policy_takes_the_url_from_gateway_redis_url(tmp_path: Path) -> None:
    path = policy_file(tmp_path, backend="redis")
    result = llm_gateway("check-policy", path, env={"GATEWAY_REDIS_URL": ENV_URL})
    assert result.returncode == 0, result.stderr
    assert "GATEWAY_REDIS_URL is set: it overrides the state section" in result.stderr
    assert "env-password" not in result.stdout + result.stderr


def test_check_policy_prints_the_url_masked(tmp_path: Path) -> None:
    result = llm_gateway("check-policy", policy_file(tmp_path, redis_url=FILE_URL))
    assert result.returncode == 0, result.stderr
    assert "redis_url: redis://:***@file-cache:6379/0" in result.stdout
    assert SECRET not in result.stdout + result.stderr


def test_check_policy_accepts_per_key_limits_under_two_workers_only_with_redis(
    tmp_path: Path,
) -> None:
    workers = {"GATEWAY_WORKERS": "2"}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**POOLS, "limits": LIMITED, "state": {"redis_url": FILE_URL}}))
    shared = llm_gateway("check-policy", str(path), env=workers)
    assert shared.returncode == 0, shared.stderr
    path.write_text(yaml.safe_dump({**POOLS, "limits": LIMITED}))
    alone = llm_gateway("check-policy", str(path), env=workers)
    assert alone.returncode == 2
    assert "per-key limits with 2 workers need the Redis state backend" in alone.stderr
    unlimited = llm_gateway("check-policy", policy_file(tmp_path, backend="local"), env=workers)
    assert unlimited.returncode == 0, unlimited.stderr


@pytest.mark.parametrize(
    ("sections", "flags", "why"),
    [
        ({"state": {"backend": "redis"}}, [], "no Redis URL is set"),
        ({"limits": LIMITED}, ["--workers", "2"], "per-key limits with 2 workers need"),
    ],
)
def test_serve_refuses_a_state_it_cannot_run_in_one_line(
    tmp_path: Path, sections: dict[str, Any], flags: list[str], why: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**POOLS, **sections}))
    result = llm_gateway("serve", "--policy", str(path), "--port", "8999", *flags)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ") and why in line


# -- a reload cannot switch the backend ----------------------------------------------------------


async def test_a_reload_keeps_the_state_section_and_applies_the_rest(tmp_path: Path) -> None:
    path = Path(policy_file(tmp_path, redis_url=FILE_URL))
    holder = policy_holder(path)
    changed = pool_policy(["http://127.0.0.1:9101"], load={"balance_eps": 0.75})
    await asyncio.to_thread(
        path.write_text, yaml.safe_dump({**changed, "state": {"backend": "local"}})
    )
    result = await holder.reload()
    assert (result.ok, result.warnings) == (True, (STATE_NEEDS_RESTART,))
    assert url_of(holder.fleet.policy.state.redis_url) == FILE_URL
    assert holder.fleet.policy.pools["small"].load.balance_eps == 0.75
    # The same file again: still not applied, still said.
    assert (await holder.reload()).warnings == (STATE_NEEDS_RESTART,)


async def test_a_reload_that_adds_per_key_limits_under_workers_without_redis_fails(
    tmp_path: Path,
) -> None:
    path = Path(policy_file(tmp_path, backend="local"))
    settings = Settings(workers=2)
    holder = policy_holder(path, refuse=policy_refusal(settings))
    await asyncio.to_thread(path.write_text, yaml.safe_dump({**POOLS, "limits": LIMITED}))
    result = await holder.reload()
    assert not result.ok and "per-key limits with 2 workers" in result.problems[0]
    assert not holder.fleet.policy.limits.tenants  # the current policy stays


async def test_a_reload_with_the_same_state_section_warns_of_nothing(tmp_path: Path) -> None:
    path = Path(policy_file(tmp_path, redis_url=FILE_URL))
    holder = policy_holder(path)
    result = await holder.reload()
    assert (result.ok, result.warnings) == (True, ())


# -- a real gateway on a real, password-protected redis-server -----------------------------------

TOKEN = "test-admin"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
"""The real gateway is started once for the tests below (module fixture, module loop)."""


@dataclass
class Running:
    redis: RedisServer
    replicas: list[ManagedProcess]
    gateway: GatewayProcess
    url: str


async def _require_password(redis: RedisServer) -> str:
    client = aioredis.from_url(redis.url)
    try:
        await client.config_set("requirepass", SECRET)
    finally:
        await client.aclose()
    return f"redis://:{SECRET}@127.0.0.1:{redis.port}/0"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def running() -> AsyncIterator[Running]:
    async with running_redis() as redis, running_sims(1) as replicas:
        url = await _require_password(redis)
        env = {
            **FAST_PROBES, "GATEWAY_ADMIN_TOKEN": TOKEN,
            # Reloads only when the test asks: one reload, one warning to count.
            "GATEWAY_POLICY_WATCH_INTERVAL_S": "600",
        }  # fmt: skip
        gateway_policy = {**pool_policy([r.url for r in replicas]), "state": {"redis_url": url}}
        gateway = await start_gateway(gateway_policy, env=env)
        assert isinstance(gateway, GatewayProcess)
        try:
            yield Running(redis, replicas, gateway, url)
        finally:
            await gateway.stop()


async def _admin(gateway: ManagedProcess, method: str, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"{gateway.url}{path}", headers=ADMIN) as response,
    ):
        return response.status, await response.json()


async def _redis_up(gateway: ManagedProcess) -> bool:
    return await metric_sum(gateway.url, "gateway_state_backend_up", backend="redis") == 1


@MODULE_LOOP
async def test_a_gateway_shares_through_the_redis_its_policy_names(running: Running) -> None:
    gateway = running.gateway
    # Redis requires the password: the backend is up only if the gateway sent it. (Alone, an
    # instance's gauge can read 1 between failures, hence the log checked below too.)
    assert await eventually(lambda: _redis_up(gateway))
    status, effective = await _admin(gateway, "GET", "/admin/policy")
    masked = f"redis://:***@127.0.0.1:{running.redis.port}/0"
    assert (status, effective["state"]["redis_url"]) == (200, masked)
    log = gateway.log_tail(1_000_000)
    assert f"shared state: redis at {masked}" in log
    assert "shared state: Redis reachable" in log
    assert not any(f"Redis {wrong}" in log for wrong in ("unreachable", "authentication failed"))
    assert SECRET not in log


@MODULE_LOOP
async def test_a_reload_changing_the_state_section_warns_and_keeps_the_backend(
    running: Running,
) -> None:
    gateway = running.gateway
    assert await eventually(lambda: _redis_up(gateway))
    urls = [r.url for r in running.replicas]
    changed = {**pool_policy(urls, load={"balance_eps": 0.75}), "state": {"key_prefix": "other"}}
    running.gateway.policy_path.write_text(yaml.safe_dump(changed))
    status, body = await _admin(gateway, "POST", "/admin/reload")
    assert (status, body["reloaded"], body["warnings"]) == (200, True, [STATE_NEEDS_RESTART])
    _, effective = await _admin(gateway, "GET", "/admin/policy")
    assert effective["pools"]["small"]["load"]["balance_eps"] == 0.75
    assert effective["state"]["key_prefix"] == "llm-gateway"
    assert effective["state"]["redis_url"] == f"redis://:***@127.0.0.1:{running.redis.port}/0"
    assert await _redis_up(gateway)
    assert gateway.log_tail(1_000_000).count("restart the gateway to apply it") == 1
