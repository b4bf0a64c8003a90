"""Specification of what a policy file cannot get past check-policy, start-up or a reload, though
YAML or a loose schema would let it through: a number that is infinite, NaN or too large to
count with, a key given twice, a key YAML reads as a boolean or a number, a tier model file that
is not a model; and of the errors themselves: each at the line of the key it names, in words
that say what to do, at most 50 of them, found from one parse of the file (off the event loop
when the file watch reloads it), and never showing a replica URL's password."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from gateway.policy.check import load_checked_policy, read_policy_file
from gateway.policy.reload import PolicyHolder
from router_policies.autoscale import desired_replicas
from router_policies.hot_prefixes import spread
from router_policies.policy_yaml import PolicyLoader
from router_policies.schema import AutoscaleSettings, InvalidPolicy, Policy, parse_policy
from router_policies.tier_classifier_learned import MODEL_FORMAT, LearnedTierModel
from tests.conftest import policy_holder

POOL = "pools:\n  small:\n    model: m\n    replicas: [http://127.0.0.1:9001]\n"
"""A valid policy's first four lines: what a test appends starts on line 5."""
TIERED = POOL + (
    "  large:\n    model: big\n    replicas: [http://127.0.0.1:9002]\n"
    "tiers:\n  auto:\n    small: small\n    large: large\n"
)
"""Two pools and a tier `auto`, whose settings a test appends from line 12."""


def llm_gateway(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The CLI with no GATEWAY_* variable set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def problems_of(tmp_path: Path, text: str) -> list[str]:
    """The problems load_checked_policy (check-policy, serve, every reload) names in ``text``."""
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(InvalidPolicy) as info:
        load_checked_policy(path)
    return info.value.problems


def holder_of(tmp_path: Path, text: str = POOL) -> PolicyHolder:
    path = tmp_path / "live.yaml"
    path.write_text(text)
    return policy_holder(path)


def small(**pool: Any) -> dict[str, Any]:
    return {"pools": {"small": {"model": "m", "replicas": ["http://127.0.0.1:9001"], **pool}}}


def tiered(**tier: Any) -> dict[str, Any]:
    pools = small()["pools"] | {"large": {"model": "big", "replicas": ["http://127.0.0.1:9002"]}}
    return {"pools": pools, "tiers": {"auto": {"small": "small", "large": "large", **tier}}}


# --- numbers: finite, and within what the router can count with -------------------------------


def _leaves(annotation: Any) -> Iterator[Any]:
    """The plain types inside an annotation (through Annotated, unions, dicts and lists)."""
    if get_origin(annotation) is Annotated:
        yield from _leaves(get_args(annotation)[0])
    elif get_args(annotation):
        for arg in get_args(annotation):
            yield from _leaves(arg)
    else:
        yield annotation


def _float_fields(
    model: type[BaseModel], seen: set[type[BaseModel]]
) -> Iterator[tuple[type[BaseModel], str]]:
    if model in seen:
        return
    seen.add(model)
    for name, info in model.model_fields.items():
        for leaf in _leaves(info.annotation):
            if leaf is float:
                yield model, name
            elif isinstance(leaf, type) and issubclass(leaf, BaseModel):
                yield from _float_fields(leaf, seen)


def _refused_as_not_finite(model: type[BaseModel], field: str, value: float) -> bool:
    try:
        model.model_validate({field: value})
    except ValidationError as exc:
        return any(e["loc"][:1] == (field,) and e["type"] == "finite_number" for e in exc.errors())
    return False


def test_no_number_in_a_policy_may_be_infinite_or_nan() -> None:
    fields = set(_float_fields(Policy, set()))
    # Found from the schema, so a float added later is covered; the sections that broke the
    # gateway are among them, so the walk is not vacuous.
    names = {(model.__name__, name) for model, name in fields}
    assert {("HotPrefixSettings", "spread_factor"), ("PrefixSettings", "chars_per_token"),
            ("TierWeights", "bias"), ("KvEventsSettings", "stall_s")} <= names  # fmt: skip
    accepted = sorted(
        f"{model.__name__}.{field}: {value}"
        for model, field in fields
        for value in (math.inf, -math.inf, math.nan)
        if not _refused_as_not_finite(model, field, value)
    )
    assert accepted == []


def test_check_policy_names_the_line_of_an_infinite_number(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POOL + "    hot: {spread_factor: .inf}\n    prefix: {chars_per_token: .nan}\n")
    result = llm_gateway("check-policy", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines()[1:] == [
        "  line 6: pools.small.prefix.chars_per_token: Input should be a finite number",
        "  line 5: pools.small.hot.spread_factor: Input should be a finite number",
    ]


async def test_a_reload_to_an_infinite_number_keeps_the_current_policy(tmp_path: Path) -> None:
    holder = holder_of(tmp_path)
    assert holder.path is not None
    holder.path.write_text(POOL + "    hot: {spread_factor: .inf}\n")
    result = await holder.reload()
    assert not result.ok
    assert result.problems == (
        "line 5: pools.small.hot.spread_factor: Input should be a finite number",
    )
    assert holder.fleet.policy.pools["small"].hot.spread_factor == 1.25


def _limits(**limits: Any) -> dict[str, Any]:
    return {**small(), "limits": limits}


def _tenant(**limits: Any) -> dict[str, Any]:
    return _limits(tenants={"acme": {"api_key_sha256": ["0" * 64], **limits}})


def _calibrated(window: int) -> dict[str, Any]:
    return tiered(calibration={"target_large_share": 0.3, "window": window})


@pytest.mark.parametrize(
    ("policy", "field", "usable", "refused"),
    [
        # Each refused value made the gateway fail where it turns the figure into a count.
        (lambda v: small(prefix={"min_match_blocks": v, "max_blocks": 1 << 20}),
         "pools.small.prefix.min_match_blocks", 1 << 20, 10**12),
        (lambda v: small(prefix={"index_blocks": v}), "pools.small.prefix.index_blocks",
         1 << 32, 10**400),
        (lambda v: small(prefix={"chars_per_token": v}), "pools.small.prefix.chars_per_token",
         100.0, 1e300),
        (lambda v: small(prefix={"chars_per_token": v}), "pools.small.prefix.chars_per_token",
         0.1, 1e-320),
        (lambda v: small(autoscale={"batch_slots": v}), "pools.small.autoscale.batch_slots",
         1 << 20, 10**400),
        (lambda v: small(autoscale={"min_replicas": v, "max_replicas": v}),
         "pools.small.autoscale.max_replicas", 2**31 - 1, 10**400),
        (_calibrated, "tiers.auto.calibration.window", 1_000_000, 10**19),
        (lambda v: _tenant(tokens_per_minute=v), "limits.tenants.acme.tokens_per_minute",
         10**12, 10**400),
        (lambda v: _tenant(requests_per_minute=v), "limits.tenants.acme.requests_per_minute",
         10**12, 10**400),
        (lambda v: _limits(completion_tokens_estimate=v), "limits.completion_tokens_estimate",
         10**12, 10**400),
    ],
    ids=["min_match_blocks", "index_blocks", "chars_per_token-high", "chars_per_token-low",
         "batch_slots", "replicas", "calibration.window", "tokens_per_minute",
         "requests_per_minute", "completion_tokens_estimate"],
)  # fmt: skip
def test_numbers_past_what_the_router_can_count_with_are_refused(
    policy: Callable[[Any], dict[str, Any]], field: str, usable: float, refused: float
) -> None:
    parse_policy(policy(usable))
    with pytest.raises(ValidationError) as info:
        parse_policy(policy(refused))
    assert field in [".".join(map(str, e["loc"])) for e in info.value.errors()]


def test_an_event_endpoint_is_keyed_by_its_replica_as_the_pool_lists_it() -> None:
    url = "http://127.0.0.1:9001/"
    events = {"endpoints": {url: {"endpoint": "tcp://127.0.0.1:5557"}}}
    pool = parse_policy(small(replicas=[url], prefix={"events": events})).pools["small"]
    assert pool.events_endpoint(pool.replicas[0]) is not None


def test_a_huge_spread_factor_spreads_a_prefix_over_every_replica() -> None:
    # Finite, yet share x replicas x factor overflows to inf: still a count.
    assert spread(0.5, 4, 1e308) == 4
    assert spread(0.25, 4, 1.0) == 1


def test_a_tiny_target_rate_asks_for_the_most_replicas_rather_than_failing() -> None:
    settings = AutoscaleSettings(target_rate_per_replica=1e-300, max_replicas=8)
    assert desired_replicas(2, 0.0, 0.0, settings, arrival_rate=1e10) == 8


# --- keys: each once, and each a name -----------------------------------------------------------


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    text = (
        "pools:\n  small:\n    model: m\n    replicas: [http://127.0.0.1:9001]\n"
        "    policy: round-robin\n    policy: least-loaded\n"
        "  small:\n    model: m2\n    replicas: [http://127.0.0.1:9002]\n"
    )
    assert problems_of(tmp_path, text) == [
        "line 6: pools.small.policy: given twice in one mapping (first on line 5); "
        "YAML would keep only the last: remove one",
        "line 7: pools.small: given twice in one mapping (first on line 2); "
        "YAML would keep only the last: remove one",
    ]


def test_a_tenant_pasted_twice_is_refused(tmp_path: Path) -> None:
    tenant = f"    acme:\n      api_key_sha256: ['{'a' * 64}']\n      requests_per_minute: 600\n"
    [problem] = problems_of(tmp_path, POOL + "limits:\n  tenants:\n" + tenant + tenant)
    assert problem.startswith(
        "line 10: limits.tenants.acme: given twice in one mapping (first on line 7)"
    )


def test_a_quoted_and_a_plain_spelling_of_one_key_are_one_key(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path, POOL + "'pools': {}\n")
    assert problem.startswith("line 5: pools: given twice in one mapping (first on line 1)")


def test_overriding_a_merge_key_is_not_a_key_given_twice(tmp_path: Path) -> None:
    # Overriding what `<<` brings in is what merge keys are for; a key of the mapping's own,
    # written twice, still is given twice.
    text = (
        "pools:\n  small: &pool\n    model: m\n    replicas: [http://127.0.0.1:9001]\n"
        "  large:\n    <<: *pool\n    model: big\n    replicas: [http://127.0.0.1:9002]\n"
    )
    twice = text + "    model: bigger\n"
    [problem] = problems_of(tmp_path, twice)
    assert problem.startswith(
        "line 9: pools.large.model: given twice in one mapping (first on line 7)"
    )
    path = tmp_path / "merged.yaml"
    path.write_text(text)
    assert load_checked_policy(path).pools["large"].model == "big"


async def test_a_reload_with_a_key_given_twice_keeps_the_current_policy(tmp_path: Path) -> None:
    holder = holder_of(tmp_path)
    assert holder.path is not None
    holder.path.write_text(POOL + "    policy: round-robin\n    policy: least-loaded\n")
    result = await holder.reload()
    assert not result.ok and "line 6: pools.small.policy: given twice" in result.problems[0]
    assert holder.fleet.policy.pools["small"].policy == "prefix-aware"


def test_a_key_yaml_reads_as_a_boolean_or_a_number_says_to_quote_it(tmp_path: Path) -> None:
    text = (
        "pools:\n  on:\n    model: m\n    replicas: [http://127.0.0.1:9001]\n"
        "  70:\n    model: m70\n    replicas: [http://127.0.0.1:9002]\n"
    )
    assert problems_of(tmp_path, text) == [
        "line 2: pools.on: YAML reads the unquoted key on as a boolean (YAML 1.1), "
        "not a name: quote it ('on')",
        "line 5: pools.70: YAML reads the unquoted key 70 as a number, not a name: quote it ('70')",
    ]
    path = tmp_path / "quoted.yaml"
    path.write_text(text.replace("  on:", "  'on':").replace("  70:", "  '70':"))
    assert set(load_checked_policy(path).pools) == {"on", "70"}


# --- tier model files: one that is not a model is a policy error --------------------------------


@pytest.fixture
def garbage_model(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.json"
    path.write_text('{"not": "a model"}')
    return path


def test_check_policy_refuses_a_tier_model_file_that_is_not_a_model(
    tmp_path: Path, garbage_model: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(TIERED + f"    model: {garbage_model}\n")
    result = llm_gateway("check-policy", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines()[1] == (
        f"  line 12: tiers.auto.model: cannot load the tier model: {garbage_model}: "
        f"not a tier model file (format is not '{MODEL_FORMAT}')"
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_a_tier_model_that_is_not_a_model_in_plain_words_and_exit_2(
    tmp_path: Path, garbage_model: Path, workers: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(TIERED + f"    model: {garbage_model}\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    # Before, one worker printed a traceback and exited 1, and two were restarted forever.
    result = llm_gateway("serve", "--policy", str(path), "--port", port, "--workers", workers,
                         timeout=30)  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "line 12: tiers.auto.model: cannot load the tier model" in result.stderr


def test_model_weights_that_are_not_numbers_are_not_a_model_file() -> None:
    doc = f'{{"format": "{MODEL_FORMAT}", "version": 1, "bias": 0, "weights": {{"a": null}}}}'
    with pytest.raises(ValueError, match=r"m\.json: not a tier model file"):
        LearnedTierModel.from_bytes(doc.encode(), "m.json")


# --- replica URLs with credentials: the password never shown ------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://admin:S3cretPW@127.0.0.1:9002",  # refused by the reachability check
        "http://admin:S3cretPW@127.0.0.1:9002/v1",  # refused by the schema (a path)
        "http://admin:S3cret?PW@127.0.0.1:9002",  # '?' cuts the URL short: the port is 'S3cret'
    ],
)
def test_a_replica_url_with_credentials_is_refused_with_its_password_masked(
    tmp_path: Path, url: str
) -> None:
    [problem] = problems_of(tmp_path, POOL.replace("http://127.0.0.1:9001", f"'{url}'"))
    assert "admin:***@127.0.0.1:9002" in problem
    assert "S3cret" not in problem


async def test_a_reload_logs_a_replica_url_with_its_password_masked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = holder_of(tmp_path)
    assert holder.path is not None
    holder.path.write_text(POOL.replace("http://127.0.0.1", "http://admin:S3cretPW@127.0.0.1"))
    with caplog.at_level(logging.ERROR, logger="gateway.policy.reload"):
        assert not (await holder.reload()).ok
    assert "admin:***@127.0.0.1:9001" in caplog.text
    assert "S3cretPW" not in caplog.text


# --- rules across fields: at the key they name, in plain words ----------------------------------

KEY_HASH = "a" * 64


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (TIERED.replace("large: large", "large: larg"),
         "line 11: tiers.auto.large: no pool named 'larg'"),
        (TIERED.replace("large: large", "large: small"),
         "line 11: tiers.auto.large: small and large are both pool 'small': a tier needs two "
         "pools (a client that wants one pool names its model)"),
        (TIERED.replace("model: big", "model: m"),
         "line 6: pools.large.model: pool 'small' already serves model 'm': a model has one "
         "pool (list every replica of it there)"),
        (TIERED.replace("  auto:", "  big:"),
         "line 9: tiers.big: tier model 'big' is also pool 'large''s model or adapter"),
        (TIERED.replace("    model: big\n", "    model: big\n    adapters: [x, m]\n"),
         "line 7: pools.large.adapters.1: adapter 'm' is also pool 'small''s model or adapter"),
        (POOL + "    autoscale:\n      max_replicas: 3\n      min_replicas: 5\n",
         "line 7: pools.small.autoscale.min_replicas: min_replicas (5) is above max_replicas (3)"),
        (POOL + f"limits:\n  tenants:\n    a: {{api_key_sha256: ['{KEY_HASH}']}}\n"
         f"    b: {{api_key_sha256: ['{KEY_HASH}']}}\n",
         "line 8: limits.tenants.b.api_key_sha256.0: tenants 'a' and 'b' share a key hash"),
        (POOL.replace("http://127.0.0.1:9001", "127.0.0.1:9001"),
         "line 4: pools.small.replicas: '127.0.0.1:9001' is not a base URL like http://host:port"),
        # The gateway names a replica by its host:port: one of the two would vanish.
        (POOL.replace("http://127.0.0.1:9001", "http://h:9001, https://u:hunter2@H:9001"),
         "line 4: pools.small.replicas: a replica is listed twice: h:9001"),
        (POOL + "    prefix:\n      max_blocks: 4\n      min_match_blocks: 5\n",
         "line 7: pools.small.prefix.min_match_blocks: min_match_blocks (5) is above max_blocks "
         "(4): no match could reach it"),
    ],
    ids=["tier-names-a-missing-pool", "tier-names-one-pool-twice", "two-pools-one-model",
         "tier-named-as-a-model", "adapter-named-as-a-model", "autoscale-bounds",
         "tenants-share-a-key", "url-without-scheme", "one-host-port-twice",
         "unreachable-match"],
)  # fmt: skip
def test_a_rule_across_fields_names_the_key_it_is_about_and_its_line(
    tmp_path: Path, text: str, problem: str
) -> None:
    # Before, such rules named no field ("(top level)") and the line of the file's first key,
    # and every message raised by a validator began with pydantic's "Value error, ".
    assert problems_of(tmp_path, text) == [problem]


# --- files that are not a policy's shape: say what to write -------------------------------------

EMPTY = "the file is empty (no settings, at most comments): a policy needs a `pools:` mapping"


@pytest.mark.parametrize("text", ["", "\n\n", "# the pools go here\n# later\n", "---\n"])
def test_an_empty_file_says_a_policy_needs_pools(tmp_path: Path, text: str) -> None:
    assert problems_of(tmp_path, text) == [EMPTY]


def test_check_policy_of_dev_null_says_the_file_is_empty() -> None:
    result = llm_gateway("check-policy", os.devnull)
    assert result.returncode == 2
    assert result.stderr.splitlines()[1:] == [f"  {EMPTY}"]


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        ("pools:\n  small:\n    model: m\n  replicas: [http://127.0.0.1:9001]\n",
         ["line 2: pools.small.replicas: Field required",
          "line 4: pools.replicas: expected a mapping (a pool's settings), got a list: is it "
          "indented under its pool?"]),
        ("pools:\n  small:\n", ["line 2: pools.small: expected a mapping (a pool's settings), "
                                "got nothing"]),
        ("pools:\n  - small\n", ["line 1: pools: expected a mapping (pool names, each with its "
                                 "settings), got a list"]),
        ("- pools\n", ["line 1: (top level): expected a mapping (`pools:` and the policy's "
                       "other sections), got a list"]),
        (TIERED + "    calibration: 0.3\n",
         ["line 12: tiers.auto.calibration: expected a mapping of settings, got a number"]),
    ],
    ids=["replicas-beside-its-pool", "pool-with-nothing", "pools-as-a-list", "top-level-list",
         "section-as-a-number"],
)  # fmt: skip
def test_a_value_that_should_be_a_mapping_says_so_in_plain_words(
    tmp_path: Path, text: str, problems: list[str]
) -> None:
    # Before: "Input should be a valid dictionary or instance of PoolPolicy".
    assert problems_of(tmp_path, text) == problems


# --- many mistakes: one parse, a screenful listed, and the event loop free ----------------------


def _pools(n: int, replica: str = "replicas: [http://10.0.0.{i}:8000]") -> str:
    return "pools:\n" + "".join(
        f"  p{i}:\n    model: m{i}\n    {replica.format(i=i)}\n" for i in range(n)
    )


@pytest.mark.parametrize(
    ("text", "first", "more"),
    [
        # `replica:` for `replicas:` in each of 60 pools: two problems a pool.
        (_pools(60, "replica: [http://10.0.0.{i}:8000]"),
         "line 2: pools.p0.replicas: Field required", 70),
        # A port out of range in each of 60 pools: found by the checks beyond the schema.
        (_pools(60, "replicas: [http://10.0.0.{i}:99999]"),
         "line 4: pools.p0.replicas.0: 'http://10.0.0.0:99999' is not a valid URL: Port out of "
         "range 0-65535", 10),
    ],
    ids=["schema", "replica-urls"],
)  # fmt: skip
def test_a_file_with_many_mistakes_is_parsed_once_and_lists_the_first_50(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, first: str, more: int
) -> None:
    # Each problem's line was found by parsing the whole file again: a reload of a file with
    # 200 mistakes held the event loop for 13 s. Counted rather than timed: one parse, however
    # many mistakes.
    parses = []
    parse = PolicyLoader.__init__

    def counted(self: PolicyLoader, stream: str) -> None:
        parses.append(stream)
        parse(self, stream)

    monkeypatch.setattr(PolicyLoader, "__init__", counted)
    problems = problems_of(tmp_path, text)
    assert len(parses) == 1
    assert problems[0] == first
    assert len(problems) == 51 and problems[-1] == f"... and {more} more problems"


async def test_the_file_watch_reads_and_validates_the_file_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = holder_of(tmp_path)
    assert holder.path is not None
    read_in: list[threading.Thread] = []

    def recorded(path: Path) -> Any:
        read_in.append(threading.current_thread())
        return read_policy_file(path)

    monkeypatch.setattr("gateway.policy.reload.read_policy_file", recorded)
    holder.path.write_text(POOL + "    load: {balance_eps: 0.5}\n")
    watch = asyncio.create_task(holder.watch(0.01))
    try:
        for _ in range(500):
            if holder.fleet.policy.pools["small"].load.balance_eps == 0.5:
                break
            await asyncio.sleep(0.01)
    finally:
        watch.cancel()
    assert holder.fleet.policy.pools["small"].load.balance_eps == 0.5
    assert read_in and threading.current_thread() not in read_in


async def test_reloads_run_one_at_a_time_and_the_later_file_is_the_one_that_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = holder_of(tmp_path)
    assert holder.path is not None
    reading, release = threading.Event(), threading.Event()

    def held(path: Path) -> Any:
        file = read_policy_file(path)
        if not reading.is_set():  # the first read, the watch's, is held until released
            reading.set()
            release.wait(timeout=30)
        return file

    monkeypatch.setattr("gateway.policy.reload.read_policy_file", held)
    holder.path.write_text(POOL + "    load: {balance_eps: 0.5}\n")
    watched = asyncio.create_task(holder.reload())
    assert await asyncio.to_thread(reading.wait, 30)
    # Another reload (SIGHUP, the admin API) while that read is under way: it reads after it,
    # and each caller gets its own file's result (an admin call is never told "failed").
    holder.path.write_text(POOL + "    load: {balance_eps: 0.75}\n")
    later = asyncio.create_task(holder.reload())
    await asyncio.sleep(0.05)
    release.set()
    assert (await watched).ok and (await later).ok
    assert holder.fleet.policy.pools["small"].load.balance_eps == 0.75
