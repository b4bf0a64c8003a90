"""The floor of a Python relay: ``bench overhead``'s yardstick for the gateway's own work.

A relay with nothing in it but the relay, on the gateway's loop (uvloop) and parser (llhttp,
by httptools): each request head parsed, the request sent on a keep-alive connection to the one
replica, the answer written back as it arrives (chunk framing kept), all from the connections'
callbacks: no task, no routing, no limits, no metrics, no logs, no retries. What it costs per
request is what any router written in Python on this loop pays at least; the gateway's figure
less this one is the gateway's own work. Tooling only: nothing here is fit to serve users (a
failure of the replica leaves its client waiting).

Run by ``bench overhead``: ``python -m bench.overhead.floor PORT UPSTREAM_HOST UPSTREAM_PORT``.
"""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import urlsplit

import httptools
import uvloop

from gateway.http.connections import RequestHead
from replica.processes import ManagedProcess, start_on_free_port


class _Upstream(asyncio.Protocol):
    """One keep-alive connection to the replica; relays its answer to the client on it."""

    transport: asyncio.Transport

    def __init__(self, idle: list[_Upstream]) -> None:
        self.idle = idle
        self.client: _Client | None = None
        self.chunked = False
        self.parser = httptools.HttpResponseParser(self)
        self.head: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"transfer-encoding":
            self.chunked = True
        self.head.append(b"%s: %s\r\n" % (name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        assert self.client is not None
        self.client.transport.write(b"HTTP/1.1 %d OK\r\n%s\r\n" % (status, b"".join(self.head)))
        self.head = []

    def on_body(self, body: bytes) -> None:
        assert self.client is not None
        self.client.transport.write(b"%x\r\n%s\r\n" % (len(body), body) if self.chunked else body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        assert client is not None
        if self.chunked:
            client.transport.write(b"0\r\n\r\n")
        self.chunked = False
        self.idle.append(self)
        client.done()


class _Client(asyncio.Protocol):
    """One client connection: a request at a time, as HTTP/1.1 keep-alive sends them."""

    transport: asyncio.Transport

    def __init__(self, relay: _Relay) -> None:
        self.relay = relay
        self.buffer = bytearray()
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self.next()

    def done(self) -> None:
        self.busy = False
        if self.buffer:
            self.next()

    def next(self) -> None:
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = RequestHead()
        parser = httptools.HttpRequestParser(head)
        parser.feed_data(bytes(buffer[: end + 4]))
        length = next((int(v) for n, v in head.fields if n.lower() == b"content-length"), 0)
        total = end + 4 + length
        if len(buffer) < total:
            return
        body = bytes(buffer[end + 4 : total])
        del buffer[:total]
        self.busy = True
        method = parser.get_method()
        request = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n" % (
            method, head.url, self.relay.host
        )  # fmt: skip
        self.relay.send(self, request + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


class _Relay:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.host = f"{host}:{port}".encode()
        self.idle: list[_Upstream] = []

    def send(self, client: _Client, request: bytes) -> None:
        if self.idle:
            _hand(self.idle.pop(), client, request)
        else:
            asyncio.get_running_loop().create_task(self._connect(client, request))

    async def _connect(self, client: _Client, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: _Upstream(self.idle), *self.upstream)
        _hand(upstream, client, request)


def _hand(upstream: _Upstream, client: _Client, request: bytes) -> None:
    """``client``'s request goes out on ``upstream``, whose answer then goes back to it."""
    upstream.client = client
    upstream.transport.write(request)


async def serve(port: int, upstream_host: str, upstream_port: int) -> None:
    relay = _Relay(upstream_host, upstream_port)
    server = await asyncio.get_running_loop().create_server(
        lambda: _Client(relay), "127.0.0.1", port
    )
    await server.serve_forever()


async def start_floor(replica_url: str) -> ManagedProcess:
    """The bare relay in front of ``replica_url``, started on a free port (it relays the
    replica's /health, which says it serves)."""
    upstream = urlsplit(replica_url)
    replica = [str(upstream.hostname), str(upstream.port)]

    def build(port: int) -> ManagedProcess:
        argv = [sys.executable, "-m", "bench.overhead.floor", str(port), *replica]
        return ManagedProcess(argv, f"http://127.0.0.1:{port}", name="floor")

    return await start_on_free_port(build)


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
