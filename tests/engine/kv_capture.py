"""Capture a built-in engine's ZMQ KV events in each format, and replay them into a cache view.

A `Capture` runs one ZmqKvPublisher per format over the engine's event log with a SUB socket on
each, so one engine run is read by every reader (tests/upstream/). `engine_cache` is what the
engine's prefix cache holds right now: its block hashes, as each format carries them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from tests.in_thread import thread_core
from trtllm_gateway.engine.builtin.block_manager import block_hash
from trtllm_gateway.engine.kv_events.log import signed64
from trtllm_gateway.engine.kv_events.wire import KvEventsFormat, unsigned64
from trtllm_gateway.engine.kv_events.zmq_publisher import ZmqKvPublisher
from trtllm_gateway.engine.transport.client import CoreClient

TOPIC = "kv@gateway"
Frames = list[tuple[bytes, bytes, bytes]]


@dataclass
class Capture:
    engine: CoreClient
    formats: tuple[KvEventsFormat, ...]
    replay: bool = False
    rank: int = 0
    address: str = "tcp://127.0.0.1:*"
    publishers: dict[str, ZmqKvPublisher] = field(default_factory=dict)
    subs: dict[str, zmq.Socket[bytes]] = field(default_factory=dict)
    ctx: zmq.Context[zmq.Socket[bytes]] = field(default_factory=zmq.Context)

    async def __aenter__(self) -> Capture:
        # The core's start-up AllBlocksCleared reaches the client's log with its first batch:
        # wait for it, so no message goes out while the subscriptions are on their way.
        deadline = time.monotonic() + 10
        # The log is the engine's own; it has no event to wait on, so poll it.
        while self.engine.kv_event_log.next_id == 0 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        for fmt in self.formats:
            replay = "tcp://127.0.0.1:*" if self.replay else None
            pub = ZmqKvPublisher(
                self.engine.kv_event_log, self.address, fmt, TOPIC, replay, self.rank
            )
            self.publishers[fmt] = pub
            sub = self.ctx.socket(zmq.SUB)
            sub.connect(pub.address)
            sub.subscribe(TOPIC.encode())
            self.subs[fmt] = sub
        await asyncio.sleep(1.0)  # ZMQ's slow joiner: the subscriptions reach the PUBs
        return self

    async def __aexit__(self, *exc: object) -> None:
        for pub in self.publishers.values():
            pub.close()
        for sub in self.subs.values():
            sub.close(linger=0)
        self.ctx.term()

    async def frames(self, fmt: str, settle_s: float = 1.0) -> Frames:
        """Every message the SUB got, once nothing new arrived for settle_s."""
        out: Frames = []
        sub = self.subs[fmt]
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < settle_s:
            if sub.poll(20):
                topic, seq, payload = sub.recv_multipart()
                out.append((topic, seq, payload))
                quiet_since = time.monotonic()
            else:
                await asyncio.sleep(0.02)
        return out


def engine_cache(engine: CoreClient, fmt: str) -> dict[int, bytes]:
    """The engine's cached blocks: the hash a format carries -> the engine's full block hash."""
    blocks = thread_core(engine).loaded.blocks  # type: ignore[union-attr]
    conv = (lambda h: h) if fmt == "dynamo" else unsigned64
    return {conv(signed64(full)): full for full in blocks.cached}


@dataclass
class CacheView:
    """A reader's view of the cache, rebuilt from stored / removed / cleared events, with each
    stored block's full hash recomputed from its decoded tokens, parent and image keys."""

    block_size: int
    held: dict[int, tuple[int | None, tuple[int, ...]]] = field(default_factory=dict)
    full: dict[int | None, bytes] = field(default_factory=lambda: {None: b""})

    def stored(
        self, hashes: list[int], parent: int | None, tokens: list[int], extra: list[bytes]
    ) -> None:
        bs = self.block_size
        assert len(tokens) == bs * len(hashes), (len(tokens), len(hashes))
        for i, h in enumerate(hashes):
            block = tuple(tokens[i * bs : (i + 1) * bs])
            # The chain the engine hashes (engine/builtin/block_manager.py block_hash)
            self.full[h] = block_hash(self.full[parent], block, extra[i])
            self.held[h] = (parent, block)
            parent = h

    def removed(self, hashes: list[int]) -> None:
        for h in hashes:
            self.held.pop(h, None)

    def cleared(self) -> None:
        self.held.clear()


def check_against_engine(view: CacheView, engine: CoreClient, fmt: str) -> int:
    """The reader holds exactly the engine's cached blocks, each under the hash the engine
    computed from the tokens the reader decoded. Returns how many blocks that is."""
    cached = engine_cache(engine, fmt)
    assert set(view.held) == set(cached), (len(view.held), len(cached))
    conv: Any = (lambda h: h) if fmt == "dynamo" else unsigned64
    for h in view.held:
        assert view.full[h] == cached[h]
        assert conv(signed64(view.full[h])) == h
    return len(cached)
