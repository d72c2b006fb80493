"""--kv-events-zmq ADDR: the KV event log on a ZMQ PUB socket, in vLLM's framing.

Three frames per message: topic (empty), an 8-byte big-endian sequence number, and a msgpack
batch `[ts, [event, ...], data_parallel_rank]` whose events are maps tagged by "type"
(BlockStored: block_hashes, parent_block_hash, token_ids, block_size, lora_id; BlockRemoved:
block_hashes; AllBlocksCleared), hashes as signed 64-bit integers. Map events are the shape of
Dynamo's TensorRT-LLM publisher; vLLM's own structs (array events, lora_name) do not decode
them (issue 22). A wildcard address binds, any other connects (vLLM's convention). Events
are queued by the engine thread and sent from a thread of their own, one batch per wake-up.
"""

from __future__ import annotations

import queue
import threading

import msgspec
import zmq

from trtllm_gateway.engine.kv_events.log import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventLog,
    KvEventRecord,
)


class _Event(msgspec.Struct, tag=True, tag_field="type"):
    pass


class _BlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = "GPU"


class _BlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = "GPU"


class _AllBlocksCleared(_Event, tag="AllBlocksCleared"):
    pass


class EventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_BlockStored | _BlockRemoved | _AllBlocksCleared]
    data_parallel_rank: int | None = 0


def wire_event(rec: KvEventRecord) -> _BlockStored | _BlockRemoved | _AllBlocksCleared:
    ev = rec.event
    if isinstance(ev, BlockStored):
        return _BlockStored(
            list(ev.block_hashes), ev.parent_block_hash, list(ev.token_ids), ev.block_size,
            ev.lora_id,
        )  # fmt: skip
    if isinstance(ev, BlockRemoved):
        return _BlockRemoved(list(ev.block_hashes))
    assert isinstance(ev, AllBlocksCleared)
    return _AllBlocksCleared()


def encode_batch(records: list[KvEventRecord]) -> bytes:
    """One batch; its records share one data-parallel rank (the publisher splits by rank)."""
    rank = records[-1].event.dp_rank
    return msgspec.msgpack.encode(
        EventBatch(records[-1].ts, [wire_event(r) for r in records], data_parallel_rank=rank)
    )


def decode_batch(payload: bytes) -> EventBatch:
    return msgspec.msgpack.decode(payload, type=EventBatch)


class ZmqKvPublisher:
    """Subscribes to a KvEventLog; close() stops the thread and the socket."""

    def __init__(self, log: KvEventLog, address: str, topic: str = "") -> None:
        self._queue: queue.SimpleQueue[KvEventRecord | None] = queue.SimpleQueue()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.set_hwm(100_000)
        if "*" in address or address.startswith(("ipc://", "inproc://")):
            self._sock.bind(address)
        else:
            self._sock.connect(address)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode()
        self._seq = 0
        self._log = log
        log.listeners.append(self._queue.put)
        self._thread = threading.Thread(target=self._run, name="kv-events-zmq", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            records = [first]
            stop = False
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                records.append(nxt)
            for batch in _by_rank(records):
                frames = [self._topic, self._seq.to_bytes(8, "big"), encode_batch(batch)]
                self._sock.send_multipart(frames)
                self._seq += 1
            if stop:
                return

    def close(self) -> None:
        self._log.listeners.remove(self._queue.put)
        self._queue.put(None)
        self._thread.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()


def _by_rank(records: list[KvEventRecord]) -> list[list[KvEventRecord]]:
    """Consecutive runs of one data-parallel rank, in order (a batch names one rank)."""
    runs: list[list[KvEventRecord]] = []
    for rec in records:
        if runs and runs[-1][-1].event.dp_rank == rec.event.dp_rank:
            runs[-1].append(rec)
        else:
            runs.append([rec])
    return runs
