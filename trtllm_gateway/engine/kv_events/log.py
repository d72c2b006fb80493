"""KV-cache events both engines publish for KV-aware routers, and the numbered log that holds them.

The events are TensorRT-LLM's and vLLM's (which Dynamo's KV router consumes): a run of full
blocks stored (chained block hashes, the parent block's hash, their token ids, block size, LoRA
id, and for image prompts the images each block's hash covers), blocks removed (evicted), all
blocks cleared. Hashes are signed 64-bit integers, as Dynamo carries them. The built-in engine's
block manager appends from the engine thread; readers (the NDJSON endpoint, the ZMQ publisher
in engine/kv_events/wire.py's formats) read by event id from the event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

# The events are msgspec structs, tagged arrays on the core's pipe (OutputBatch.kv_events): an
# API server decodes them in C, where building them from JSON-shaped dicts was 13% of its main
# thread at 256 running (py-spy, H200, 2026-11-28), with every API server reading every event.


class MmSpan(msgspec.Struct, frozen=True, array_like=True):
    """An image whose identity a block's hash covers: what a router needs to tell two prompts
    apart that differ only by image (their placeholder tokens are the same)."""

    mm_hash: str  # the image's identity: hex BLAKE3 of its bytes (multimodal/images.py)
    offset: int  # its first placeholder token, relative to the block's first token
    length: int  # its placeholder tokens


class BlockStored(msgspec.Struct, frozen=True, array_like=True, tag=True):
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]  # block_size tokens per hash, in order
    block_size: int
    lora_id: int | None = None
    dp_rank: int = 0  # the data-parallel rank whose cache this is (--data-parallel-rank, or
    # TensorRT-LLM's attention-DP rank on top of it)
    # Per block (one entry per hash): the images mixed into its hash; () for a text prompt.
    block_mm: tuple[tuple[MmSpan, ...], ...] = ()


class BlockRemoved(msgspec.Struct, frozen=True, array_like=True, tag=True):
    block_hashes: tuple[int, ...]
    dp_rank: int = 0


class AllBlocksCleared(msgspec.Struct, frozen=True, array_like=True, tag=True):
    dp_rank: int = 0


KvCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventSink(Protocol):
    """Where a block manager reports its events: a KvEventLog, or a core's KvEventOutbox."""

    def append(self, event: KvCacheEvent) -> None: ...


@dataclass(frozen=True, slots=True)
class KvEventRecord:
    event_id: int
    ts: float  # time.time() when appended
    event: KvCacheEvent


def signed64(value: bytes | int) -> int:
    """A block hash as a signed 64-bit integer (digests: their first 8 bytes, little endian)."""
    if isinstance(value, bytes):
        return int.from_bytes(value[:8], "little", signed=True)
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def event_json(rec: KvEventRecord, token_ids: bool = True) -> dict[str, Any]:
    """One event as JSON (the NDJSON stream's lines): vLLM's field names plus id and time.

    token_ids=False leaves a BlockStored's tokens out (its hashes stay): the tokens are users'
    prompts, for a consumer that asked for them only.
    """
    return {"event_id": rec.event_id, "ts": rec.ts} | event_fields(rec.event, token_ids)


def event_fields(ev: KvCacheEvent, token_ids: bool = True) -> dict[str, Any]:
    """The event's own fields as JSON (event_json without the log's id and time)."""
    out: dict[str, Any] = {"type": type(ev).__name__, "dp_rank": ev.dp_rank}
    if isinstance(ev, BlockStored):
        out |= {
            "block_hashes": list(ev.block_hashes),
            "parent_block_hash": ev.parent_block_hash,
            "block_size": ev.block_size,
            "lora_id": ev.lora_id,
        }
        if token_ids:
            out["token_ids"] = list(ev.token_ids)
        if ev.block_mm:
            out["block_mm"] = [[[m.mm_hash, m.offset, m.length] for m in b] for b in ev.block_mm]
    elif isinstance(ev, BlockRemoved):
        out["block_hashes"] = list(ev.block_hashes)
    return out


def event_from_json(raw: dict[str, Any]) -> KvCacheEvent:
    """The inverse of event_json (a decode instance following a sibling); ValueError if bad."""
    kind = raw.get("type")
    try:
        if kind == "BlockStored":
            parent = raw.get("parent_block_hash")
            return BlockStored(
                block_hashes=tuple(int(h) for h in raw["block_hashes"]),
                parent_block_hash=None if parent is None else int(parent),
                token_ids=tuple(int(t) for t in raw.get("token_ids", ())),
                block_size=int(raw["block_size"]),
                lora_id=raw.get("lora_id"),
                dp_rank=int(raw.get("dp_rank") or 0),
                block_mm=tuple(
                    tuple(MmSpan(str(h), int(o), int(n)) for h, o, n in b)
                    for b in raw.get("block_mm") or ()
                ),
            )
        if kind == "BlockRemoved":
            hashes = tuple(int(h) for h in raw["block_hashes"])
            return BlockRemoved(hashes, dp_rank=int(raw.get("dp_rank") or 0))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"bad {kind} event: {e}") from None
    if kind == "AllBlocksCleared":
        return AllBlocksCleared(dp_rank=int(raw.get("dp_rank") or 0))
    raise ValueError(f"unknown KV event type {kind!r}")


class KvEventOutbox:
    """The events an engine core made since it last sent a batch, drained by each batch: the
    client's KvEventLog numbers and keeps them. The core kept a numbered log of its own too,
    a million records deep, for nobody to read (issue 39, item 2: the step's KV-event share)."""

    def __init__(self) -> None:
        self._events: list[KvCacheEvent] = []

    def append(self, event: KvCacheEvent) -> None:
        self._events.append(event)

    def drain(self) -> list[KvCacheEvent]:
        out, self._events = self._events, []
        return out


class KvEventLog:
    """A bounded, numbered, thread-safe log of KV events with async waiting for new ones.

    `instance` changes with every process, so a reader that sees another instance than before
    knows the writer restarted (its ids start over and its cache is empty).
    """

    def __init__(
        self, block_size: int, num_blocks: int = 0, capacity: int = 100_000, enabled: bool = True
    ) -> None:
        self.enabled = enabled  # False: the engine can publish events but was not asked to
        self.instance = uuid.uuid4().hex
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._records: deque[KvEventRecord] = deque(maxlen=capacity)
        self._next_id = 0
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.listeners: list[Any] = []  # callables taking a KvEventRecord (the ZMQ publisher)

    @property
    def next_id(self) -> int:
        return self._next_id

    def append(self, event: KvCacheEvent) -> None:
        """Any thread. Wakes the readers waiting on their event loops."""
        self.extend((event,))

    def extend(self, events: Iterable[KvCacheEvent]) -> None:
        """append() for a batch's events: numbered in order, one time, one wake-up."""
        with self._lock:
            now, first = time.time(), self._next_id
            recs = [KvEventRecord(first + i, now, ev) for i, ev in enumerate(events)]
            if not recs:
                return
            self._next_id = first + len(recs)
            self._records.extend(recs)
            waiters, self._waiters = self._waiters, []
        for listener in self.listeners:
            for rec in recs:
                listener(rec)
        for loop, flag in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(flag.set)

    def since(self, after: int) -> tuple[list[KvEventRecord], bool]:
        """Records with event_id > after, and whether some after `after` were already dropped."""
        with self._lock:
            first = self._records[0].event_id if self._records else self._next_id
            lost = after + 1 < first
            start = max(0, after + 1 - first)
            return [self._records[i] for i in range(start, len(self._records))], lost

    async def wait(self, after: int, seconds: float) -> None:
        """Return once an event with id > after exists, or after `seconds`."""
        flag = asyncio.Event()
        with self._lock:
            if self._next_id > after + 1:
                return
            self._waiters.append((asyncio.get_running_loop(), flag))
        try:
            await asyncio.wait_for(flag.wait(), seconds)
        except TimeoutError:
            with self._lock:
                self._waiters = [w for w in self._waiters if w[1] is not flag]
