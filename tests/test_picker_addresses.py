"""The address the picker names to Envoy: a replica's host resolved to ip:port, again after
ADDRESS_TTL_S (a restarted StatefulSet pod keeps its name, not its IP), the last one kept while
the name does not resolve."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from gateway.picker.picker import ADDRESS_TTL_S, Addresses


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


REPLICA = "http://vllm-0.vllm.llm.svc:8000"


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> tuple[Clock, list[str | None]]:
    """A clock the test moves, and the IPs the name resolves to, in turn (None: it fails)."""
    clock, answers = Clock(), list[str | None]()

    async def getaddrinfo(self: Any, host: str, port: int, **kw: Any) -> list[Any]:
        ip = answers.pop(0)
        if ip is None:
            raise socket.gaierror("Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]

    monkeypatch.setattr("gateway.picker.picker.time.monotonic", clock)
    monkeypatch.setattr("asyncio.BaseEventLoop.getaddrinfo", getaddrinfo)
    monkeypatch.setattr("uvloop.Loop.getaddrinfo", getaddrinfo, raising=False)
    return clock, answers


async def test_a_name_is_resolved_again_once_its_address_is_older_than_the_ttl(
    resolver: tuple[Clock, list[str | None]],
) -> None:
    clock, answers = resolver
    addresses = Addresses()
    answers += ["10.0.0.5", "10.0.0.9"]
    assert await addresses.of(REPLICA) == "10.0.0.5:8000"
    clock.now += ADDRESS_TTL_S / 2
    assert await addresses.of(REPLICA) == "10.0.0.5:8000"
    clock.now += ADDRESS_TTL_S
    assert await addresses.of(REPLICA) == "10.0.0.9:8000"
    assert answers == []


async def test_while_the_name_does_not_resolve_the_last_address_stands(
    resolver: tuple[Clock, list[str | None]],
) -> None:
    clock, answers = resolver
    addresses = Addresses()
    answers += ["10.0.0.5", None]
    assert await addresses.of(REPLICA) == "10.0.0.5:8000"
    clock.now += 2 * ADDRESS_TTL_S
    assert await addresses.of(REPLICA) == "10.0.0.5:8000"
    answers.append(None)
    with pytest.raises(OSError):  # never resolved: nothing to name
        await Addresses().of(REPLICA)
