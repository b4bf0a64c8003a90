"""One replica's KV-cache event stream (vLLM's ``--kv-events-config``): the subscription, its
sequence numbers and replay, and whether what it built can be trusted right now.

The wire format is vLLM's (``vllm/distributed/kv_events.py``; replica/sim/kv_events.py speaks
it too): ``(topic, seq, payload)`` messages, ``seq`` 8 bytes big-endian, ``payload`` a msgpack
``[ts, events, data_parallel_rank]`` whose events are maps tagged by ``type``. Older releases
are read too: events as arrays (the tag, then the fields in order), replay replies without the
topic. The stream is exact while its sequence has no hole. A hole the replay endpoint cannot
fill, or a replica that computed new blocks without reporting them for ``stall_s``, sends
routing back to the estimate for that replica (one log line, a metric); a hole drops what was
believed held (``EngineBlocks.forget``), and after ``resync_s`` of a clean stream it is exact
again. A message that cannot be read (not vLLM's format, or more than any engine step sends) is
skipped and lost as a hole is; the subscription goes on. Messages are applied a slice at a
time, so that a large or fast publisher does not hold up the requests the event loop is serving.
An address ZeroMQ refuses is logged once; no message is counted lost from it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from router_policies.block_layout import BlockLayout
from router_policies.engine_blocks import EngineBlocks, cached_tokens, leading, root_key
from router_policies.fingerprint import RequestFeatures

log = logging.getLogger(__name__)

_END_SEQ = -1
_REPLAY_TIMEOUT_S = 1.0
_GPU_MEDIA = frozenset((None, "GPU", "gpu"))
"""Blocks in the engine's own cache; the events of any other medium are another tier's (vLLM's
CPU offloading), whose blocks the engine loads back rather than computes."""
_BLOCK_EVENTS = frozenset(("BlockStored", "BlockRemoved"))
_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
        "lora_name", "extra_keys", "group_idx",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
}  # fmt: skip
"""The fields of an event in older vLLM's array form, in the order it declares them."""

MAX_STEP_BLOCKS = 1 << 17
"""Most events, and most block hashes, one message may carry; a message with more is unreadable.
vLLM publishes one message per engine step: a BlockStored per request scheduled and KV-cache
group, a BlockRemoved per block evicted (one event each) to make room for the step's new blocks,
and an offloading tier's events as many again. A step of 1,024 requests (``max_num_seqs``, 256 by
default) over 65,536 batched tokens (``max_num_batched_tokens``, 8,192 at most by default) in
16-token blocks, every new block evicting one, four KV groups and a tier: about 49,000 events and
82,000 hashes; vLLM's defaults send a few hundred. The bound keeps what a broken publisher has
one message add, and the loop walk, to what an engine could send."""
MAX_STEP_BYTES = 1 << 24
"""Most bytes one message may carry, checked before it is decoded: decoding is one call the
event loop cannot interleave (~37 ns a byte on a 2-core VM: 0.6 s for this). The step above is
about 5 MB (its token ids at 3-5 bytes each, ~60-100 bytes an event)."""
_SLICE = 1024
"""Events and block hashes applied between two turns of the event loop: a few milliseconds
(8 us a one-block BlockStored, 1.4 us a hash of a longer one, on a 2-core VM); each message
counts one, so that a burst of small ones yields too."""
_UNREADABLE = (
    msgspec.MsgspecError, ValueError, TypeError, LookupError, AttributeError, ArithmeticError,
    RecursionError,
)  # fmt: skip
"""What a message not in vLLM's format raises while applied: not msgpack, not a batch, an event
not a map or missing a key, a token id past 64 bits, a block hash that is a list, a block size
not a count, msgpack nested deeper than the decoder goes, a bound above."""


class Unreadable(ValueError):
    """A message more than an engine step could send (``MAX_STEP_BLOCKS``, ``MAX_STEP_BYTES``)."""


class EventStream:
    """What one replica's engine holds, as its events say, and whether to believe it now."""

    def __init__(
        self,
        endpoint: str,
        replay: str | None = None,
        topic: str = "",
        stall_s: float = 5.0,
        resync_s: float = 30.0,
    ) -> None:
        self.endpoint = endpoint
        self.replay = replay
        self.topic = topic
        self.stall_s = stall_s
        self.resync_s = resync_s
        self.blocks = EngineBlocks()
        self.next_seq: int | None = None
        """The sequence number expected next (None before the first message)."""
        self.unconfirmed = False
        """The replica failed its probes since the last message: its next message's sequence
        tells whether the engine went on (its index holds) or started over (it is cleared)."""
        self.lost_until = 0.0
        """Monotonic time until which a hole's aftermath keeps the stream inexact."""
        self.expect_since: float | None = None
        """When the replica first computed blocks it has not reported yet."""
        self.gaps = 0
        """Holes the replay could not fill (a metric's count)."""
        self.last_event_at = 0.0
        self.was_exact = False
        """What routing read at the last look (a change is logged once)."""
        self.inflight: Counter[int] = Counter()
        """Fingerprint blocks of the requests in flight here: the engine stores their blocks
        once it has prefilled them, and until its events say so, a request sharing their
        prefix must still find them here."""
        self._decode = msgspec.msgpack.Decoder().decode
        self._unsliced = 0
        """Events, hashes and messages applied since the event loop last had a turn."""

    def exact(self, now: float) -> bool:
        if self.next_seq is None or self.unconfirmed or now < self.lost_until:
            return False
        return self.expect_since is None or now - self.expect_since < self.stall_s

    def cached(self, request: RequestFeatures) -> int:
        """Tokens of ``request`` its engine would reuse (needs the request's token keys)."""
        matched = self.blocks.match(request.token_keys)
        return cached_tokens(matched, request.prompt_tokens, self.blocks.block_size)

    def held_bytes(self, request: RequestFeatures, layout: BlockLayout, estimated: int) -> int:
        """Bytes of the (tokenized) request's canonical prompt the engine holds, by its
        events, or is prefilling for requests in flight here, by their fingerprints;
        ``estimated``: what the estimate says it holds."""
        held = 0
        if request.prompt_tokens:
            per_token = request.hashed_bytes / request.prompt_tokens
            held = int(self.cached(request) * per_token)
            # Tokens map onto the canonical text only roughly (the chat template's own tokens,
            # whole blocks, the last token always recomputed): within two blocks of the
            # estimate, either way, the engine holds what the estimate believes, to its finer
            # alignment. A hot prefix's holders then hold its lead, not a few template tokens
            # more that its spread homes lack and the copy charge would bill them for.
            if abs(held - estimated) <= 2 * self.blocks.block_size * per_token:
                held = estimated
        if self.inflight:
            inflight = leading(request.block_hashes, self.inflight)
            held = max(held, min(layout.end(inflight), request.hashed_bytes))
        return held

    def capacity_tokens(self, cache_tokens: int) -> int | None:
        """What the engine holds at most, given its KV cache's size: the larger of the cache and
        a tier behind it (vLLM's CPU offloading, written every block the cache computes); None
        while such a tier has evicted nothing: it holds all it was written, up to a size no
        metric tells."""
        blocks = self.blocks
        tier = blocks.tier_tokens
        if not tier:
            return cache_tokens
        if not blocks.tier_evicted:
            return None
        return max(cache_tokens, tier)

    def dispatched(self, request: RequestFeatures, now: float) -> int | None:
        """A request sent here: in flight until it ends; the tokens the events say the engine
        holds of it (None where it was not tokenized or the stream is not exact)."""
        self.inflight.update(request.block_hashes)
        return self.cached(request) if request.token_keys and self.exact(now) else None

    def ended(
        self, request: RequestFeatures, uncached_tokens: float, dispatched_at: float, now: float
    ) -> None:
        """The request ended. If it computed whole new blocks and no event came since it was
        sent, their events are overdue: the stream stalls after ``stall_s`` more."""
        inflight = self.inflight
        inflight.subtract(request.block_hashes)
        for key in request.block_hashes:
            if inflight[key] <= 0:
                del inflight[key]
        if uncached_tokens >= 2 * self.blocks.block_size and self.last_event_at < dispatched_at:
            self.expect(now)

    def expect(self, now: float) -> None:
        """The replica computed whole new blocks: their events are due."""
        if self.expect_since is None:
            self.expect_since = now

    def went_down(self) -> None:
        """The replica failed its probes: it may come back restarted, with an empty cache, or
        from a moment's stall with its cache whole. Clearing here would throw the second's
        index away; until a message tells which, the estimate routes there."""
        self.unconfirmed = True

    def apply(self, seq: int, payload: bytes) -> None:
        """Applies message ``seq`` whole, raising what cannot be read (the subscription reads
        each with ``read``)."""
        for _ in self._applying(seq, payload):
            pass

    async def read(self, seq: int, payload: bytes, replica: str) -> None:
        """Applies message ``seq`` a slice at a time, the event loop running between; one that
        cannot be read is lost, as a hole is (what it half applied goes with the rest)."""
        try:
            for _ in self._applying(seq, payload):
                await asyncio.sleep(0)
        except _UNREADABLE as exc:
            self.lost(time.monotonic(), replica, f"sent message {seq}, unreadable ({exc!r:.200})")

    def _applying(self, seq: int, payload: bytes) -> Iterator[None]:
        """Applies message ``seq``, pausing (a yield) after every ``_SLICE`` events and hashes."""
        if self.next_seq is not None and seq < self.next_seq:
            # The publisher started over (the engine restarted): its cache is new.
            self.blocks.clear()
        # The sequence goes on past a message even if it cannot be read: it is lost, not a hole.
        self.next_seq = seq + 1
        self.unconfirmed = False
        self.expect_since = None
        self.last_event_at = time.monotonic()
        if len(payload) > MAX_STEP_BYTES:
            raise Unreadable(f"{len(payload)} bytes")
        batch = self._decode(payload)
        # A map where vLLM's EventBatch was not array-like (a part of its history).
        events = batch["events"] if isinstance(batch, dict) else batch[1]
        if len(events) > MAX_STEP_BLOCKS:
            raise Unreadable(f"{len(events)} events")
        blocks = self.blocks
        hashes_left = MAX_STEP_BLOCKS
        self._unsliced += 1
        if self._unsliced >= _SLICE:  # a burst of messages with few events each
            self._unsliced = 0
            yield
        for event in events:
            if self._unsliced >= _SLICE:
                self._unsliced = 0
                yield
            self._unsliced += 1
            if isinstance(event, list):
                event = as_map(event)
            kind = event.get("type")
            if kind == "AllBlocksCleared":
                blocks.clear()
                continue
            if kind not in _BLOCK_EVENTS or event.get("group_idx"):
                continue  # another KV group's, or an event that says nothing of blocks held
            hashes = event["block_hashes"]
            hashes_left -= len(hashes)
            if hashes_left < 0:
                raise Unreadable(f"over {MAX_STEP_BLOCKS} block hashes")
            self._unsliced += len(hashes)
            if (medium := event.get("medium")) not in _GPU_MEDIA:
                if kind == "BlockStored":
                    blocks.offloaded(str(medium), hashes, event.get("block_size") or 0)
                else:
                    blocks.unloaded(str(medium), hashes)
            elif kind == "BlockStored":
                _stored(blocks, event)
            else:
                blocks.removed(hashes)

    def lost(self, now: float, replica: str, what: str = "lost a message") -> None:
        """A hole nothing could fill, or a message that could not be read: an eviction may have
        gone with it. Each is counted; only the first of an inexact period is logged (a
        publisher dropping every other message would otherwise log as fast as it sends)."""
        self.blocks.forget()
        self.gaps += 1
        if now >= self.lost_until:
            log.warning(
                "KV events of replica %s %s: routing there on the estimate until %.0f s pass "
                "with no message lost (losses meanwhile are counted, not logged)",
                replica, what, self.resync_s,
            )  # fmt: skip
        self.lost_until = now + self.resync_s

    async def run(self, replica: str) -> None:
        """Subscribes until cancelled."""
        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        try:
            sub.connect(self.endpoint)
        except zmq.ZMQError as exc:
            sub.close(linger=0)
            await self._unreachable(replica, exc)
            return
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                expected = self.next_seq
                if expected is not None and seq > expected:
                    if not await self._replay(ctx, expected, seq, replica):
                        self.lost(time.monotonic(), replica)
                elif expected is None and seq > 0 and self.replay:
                    # Joined mid-stream: what the replay still buffers tells what came before;
                    # a hole in it, once some of it was applied, hides evictions as any hole.
                    whole = await self._replay(ctx, None, seq, replica)
                    if not whole and self.next_seq is not None:
                        self.lost(time.monotonic(), replica)
                await self.read(seq, frames[2], replica)
        finally:
            sub.close(linger=0)

    async def _unreachable(self, replica: str, exc: zmq.ZMQError) -> None:
        """Waits until cancelled, logged once: an address ZeroMQ refuses stays refused (ended,
        the task would be started again every second), and nothing sent was lost (no hole)."""
        log.error(
            "KV events of replica %s: cannot subscribe at %s (%s); routing there on the "
            "estimate until a policy names an address ZeroMQ takes",
            replica, self.endpoint, exc,
        )  # fmt: skip
        await asyncio.Event().wait()

    async def _replay(
        self, ctx: zmq.asyncio.Context, first: int | None, until: int, replica: str
    ) -> bool:
        """Fills the hole [first, until) from the replay endpoint; whether it did. ``first``
        None: joining mid-stream, from the oldest message the replay still buffers (an engine
        that has run a while no longer holds its first)."""
        if not self.replay:
            return False
        sock = ctx.socket(zmq.DEALER)
        # Unbounded: the engine sends its whole buffer at once (10,000 messages by default)
        # and drops what a full queue here would not take, while each is applied in slices.
        sock.setsockopt(zmq.RCVHWM, 0)
        filled = first
        try:
            sock.connect(self.replay)
            await sock.send_multipart((b"", (first or 0).to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), _REPLAY_TIMEOUT_S)
                # [b"", topic, seq, payload]; before vLLM put the topic in, [b"", seq, payload].
                if len(frames) not in (3, 4):
                    continue
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == _END_SEQ:
                    break
                if filled is None:
                    filled = seq
                if filled <= seq < until and seq == filled:
                    await self.read(seq, frames[-1], replica)
                    filled = seq + 1
        except (TimeoutError, zmq.ZMQError):
            pass  # a replay that does not answer, or an address ZeroMQ refuses: the hole stays
        finally:
            sock.close(linger=0)
        return filled is not None and filled >= until


def as_map(event: list[Any]) -> dict[str, Any]:
    """An event in older vLLM's array form, ``[tag, field, ...]`` (trailing defaults may be
    left out), as the map vLLM sends now; an unknown tag keeps only its tag."""
    kind, *values = event
    return {"type": kind, **dict(zip(_FIELDS.get(kind, ()), values, strict=False))}


def _stored(blocks: EngineBlocks, event: dict[str, Any]) -> None:
    lora = event.get("lora_name")
    extra: Sequence[Any] | None = event.get("extra_keys")
    hashes = event["block_hashes"]
    salt = None
    keyable = None
    if extra:
        keyable = []
        for i, keys in enumerate(extra[: len(hashes)]):
            items = list(keys or ())
            if lora is not None and items and items[0] == lora:
                items = items[1:]
            strings = [k for k in items if isinstance(k, str)]
            # An image's or an embedding's key is not in the tokens: nothing matches it.
            keyable.append(len(strings) == len(items))
            if i == 0 and strings:
                salt = strings[0]
    if lora is None and event.get("lora_id") is not None:
        # Older vLLM names an adapter only by its number, which no request carries: keyed by
        # the tokens alone, its blocks would match the base model's requests.
        keyable = [False] * len(hashes)
    root = root_key(lora, salt)
    blocks.stored(
        hashes, event.get("parent_block_hash"), event["token_ids"], event["block_size"], root,
        keyable,
    )  # fmt: skip
