"""What the gateway shows back holds no secret and no client megabytes: a policy file's YAML
syntax error names the problem and where (check-policy, the serve log and the /admin/reload
answer show it), never the line, which may hold a password or a pasted key; a Redis URL is
shown with every password masked, however redis-py would read it; an error message repeats a
bounded part of the client's value."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.http.errors import ECHO_CHARS, ApiError, model_not_found
from gateway.http.responses_lookup import not_found
from router_policies.policy_yaml import InvalidPolicy, read_validated
from router_policies.redis_url import mask
from router_policies.schema import Policy

MISINDENTED_REDIS_URL = """\
state:
  backend: redis
   redis_url: redis://:HUNTER2-redis-pw@cache:6379/0
"""
PASTED_KEY = """\
limits:
  tenants:
    acme: {api_key_sha256: [sk-live-PASTED-KEY-123]]}
"""
TAGGED_KEY = """\
limits:
  tenants:
    acme: {api_key_sha256: [!sk-live-SECRET x]}
"""


@pytest.mark.parametrize(
    ("text", "secret", "where", "what"),
    [
        (MISINDENTED_REDIS_URL, "HUNTER2", "line 3, column 13", "mapping values are not allowed"),
        (PASTED_KEY, "PASTED-KEY", "line 3, column 52", "expected ',' or '}', but got ']'"),
        # PyYAML's own wording quotes an alias's or a tag's name: a secret starting with * or !
        ("state:\n  redis_url: *Hunter2pw\n", "Hunter2", "line 2, column 14", "undefined alias"),
        (TAGGED_KEY, "sk-live", "line 3, column 29", "could not determine a constructor"),
    ],
)
def test_a_yaml_syntax_error_says_what_and_where_never_the_line(
    text: str, secret: str, where: str, what: str
) -> None:
    with pytest.raises(InvalidPolicy) as refused:
        read_validated(text, Policy)
    [problem] = refused.value.problems
    assert secret not in problem
    assert problem.startswith(f"{where}: not valid YAML: ")
    assert what in problem


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://cache/0?password=SECRET", "redis://cache/0?password=***"),
        ("rediss://cache/0?ssl_password=SECRET", "rediss://cache/0?ssl_password=***"),
        ("redis://cache/0?pass%77ord=SECRET", "redis://cache/0?pass%77ord=***"),
        ("redis://cache/0?Password=SE#CRET&db=1", "redis://cache/0?Password=***&db=1"),
        ("rediss://cache/0?ssl_cert_reqs=none&db=1", "rediss://cache/0?ssl_cert_reqs=none&db=1"),
    ],
)
def test_every_password_a_redis_url_carries_is_masked(url: str, shown: str) -> None:
    assert mask(url) == shown


@pytest.mark.parametrize(
    ("error", "value"),
    [
        (model_not_found, "m" * 3_000_000),
        (not_found, "resp_" + "x" * 3_000_000),
    ],
)
def test_an_error_repeats_a_bounded_part_of_the_clients_value(
    error: Callable[[str], ApiError], value: str
) -> None:
    message = error(value).message
    assert value[:ECHO_CHARS] in message
    assert len(message) < 2 * ECHO_CHARS + 100
    assert f"({len(value)} chars)" in message  # it says it was cut


def test_a_short_value_is_repeated_whole() -> None:
    assert model_not_found("gpt-none").message == "The model 'gpt-none' does not exist."
    assert not_found("resp_1").message == "Response with id 'resp_1' not found."
