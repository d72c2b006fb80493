"""--kv-events-zmq ADDR: the KV event log on ZMQ PUB sockets, framed as vLLM and Dynamo frame it.

Every message is three frames: the topic (--kv-events-topic, default empty), an 8-byte big-endian
sequence number, and a payload in --kv-events-format (engine/kv_events/wire.py). Counted as each
publisher counts:

- dynamo (ai-dynamo/dynamo components/src/dynamo/trtllm/publisher.py @ 0d38568995b5): one socket,
  one message per event, one sequence; the batch names the event's data-parallel rank.
- vllm, vllm-array (vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e5,
  ZmqEventPublisher): one publisher per data-parallel rank, its ports offset by the rank
  (offset_endpoint_port), each with its own sequence from 0 and one batch per publish of that
  rank's events; with --kv-events-replay a ROUTER socket answers a request `[identity, b"",
  start_seq (8 bytes big-endian)]` with every buffered batch from start_seq (the last 10,000) as
  `[identity, b"", seq, payload]`, then `[identity, b"", -1 (8 bytes, signed), b""]`.

An address with `*` or `::` binds, as do ipc:// and inproc://; any other connects (vLLM's
convention). Events are queued by the engine's thread and sent from a thread of their own that
also answers replay requests, so the sockets are only ever touched by that thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, field

import zmq

from trtllm_gateway.engine.kv_events.log import KvEventLog, KvEventRecord
from trtllm_gateway.engine.kv_events.wire import KvEventsFormat, dynamo_payload, vllm_payload

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # vLLM's end-of-replay marker
REPLAY_BUFFER = 10_000  # vLLM's buffer_steps default


def offset_port(endpoint: str | None, rank: int) -> str | None:
    """vLLM's offset_endpoint_port: a tcp port plus the rank, an inproc name + `_dp{rank}`
    (a wildcard port stays a wildcard)."""
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    base, _, port = endpoint.rpartition(":")
    if "tcp" not in endpoint or not base or port == "*":
        return endpoint
    return f"{base}:{int(port) + rank}"


def _open(ctx: zmq.Context[zmq.Socket[bytes]], kind: int, address: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    sock.set_hwm(100_000)
    binds = "*" in address or "::" in address or address.startswith(("ipc://", "inproc://"))
    if binds or kind == zmq.ROUTER:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock


@dataclass
class _Channel:
    """One publisher's sockets, sequence and replay buffer."""

    pub: zmq.Socket[bytes]
    replay: zmq.Socket[bytes] | None
    seq: int = 0
    sent: deque[tuple[int, bytes]] = field(default_factory=lambda: deque(maxlen=REPLAY_BUFFER))


class ZmqKvPublisher:
    """Subscribes to a KvEventLog; close() stops the thread and the sockets.

    `addresses` / `replay_addresses` map a data-parallel rank to its bound or connected
    endpoint (the dynamo format has one socket, under the first rank)."""

    def __init__(
        self,
        log: KvEventLog,
        address: str,
        fmt: KvEventsFormat = "dynamo",
        topic: str = "",
        replay: str | None = None,
        rank: int = 0,
    ) -> None:
        self._fmt = fmt
        self._address = address
        self._replay_address = replay if fmt != "dynamo" else None
        self._topic = topic.encode()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._channels: dict[int, _Channel] = {}
        self.addresses: dict[int, str] = {}
        self.replay_addresses: dict[int, str] = {}
        self._first_rank = rank
        self._channel(rank)  # open now: a bad address fails at start-up, not on a thread
        self._queue: queue.SimpleQueue[KvEventRecord | None] = queue.SimpleQueue()
        self._log = log
        log.listeners.append(self._queue.put)
        self._thread = threading.Thread(target=self._run, name="kv-events-zmq", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return self.addresses[self._first_rank]

    def _channel(self, rank: int) -> _Channel:
        key = self._first_rank if self._fmt == "dynamo" else rank
        ch = self._channels.get(key)
        if ch is not None:
            return ch
        pub = _open(self._ctx, zmq.PUB, offset_port(self._address, key) or self._address)
        self.addresses[key] = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        rep = None
        if self._replay_address:
            rep = _open(self._ctx, zmq.ROUTER, offset_port(self._replay_address, key) or "")
            self.replay_addresses[key] = rep.getsockopt_string(zmq.LAST_ENDPOINT)
        ch = self._channels[key] = _Channel(pub, rep)
        return ch

    def _run(self) -> None:
        while True:
            for ch in list(self._channels.values()):
                if ch.replay is not None and ch.replay.poll(0):
                    self._serve_replay(ch)
            try:
                first = self._queue.get(timeout=0.1 if self._replay_address else None)
            except queue.Empty:
                continue
            records: list[KvEventRecord] = []
            stop = first is None
            if first is not None:
                records.append(first)
            while not stop:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                stop = nxt is None
                if nxt is not None:
                    records.append(nxt)
            try:
                self._send(records)
            except zmq.ZMQError as e:
                logger.warning("KV events not published: %s", e)
            if stop:
                return

    def _send(self, records: list[KvEventRecord]) -> None:
        if self._fmt == "dynamo":
            for rec in records:
                self._emit(self._channel(rec.event.dp_rank), dynamo_payload(rec))
            return
        array = self._fmt == "vllm-array"
        for rank, run in _by_rank(records):
            self._emit(self._channel(rank), vllm_payload(run, rank, array))

    def _emit(self, ch: _Channel, payload: bytes) -> None:
        seq = ch.seq
        ch.seq += 1
        ch.pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
        if ch.replay is not None:
            ch.sent.append((seq, payload))

    def _serve_replay(self, ch: _Channel) -> None:
        assert ch.replay is not None
        frames = ch.replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("bad KV event replay request: %d frames", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in ch.sent:
            if seq >= start_seq:
                ch.replay.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
        ch.replay.send_multipart([client, b"", END_SEQ, b""])

    def close(self) -> None:
        self._log.listeners.remove(self._queue.put)
        self._queue.put(None)
        self._thread.join(timeout=5)
        for ch in self._channels.values():
            ch.pub.close(linger=0)
            if ch.replay is not None:
                ch.replay.close(linger=0)
        self._ctx.term()


def _by_rank(records: list[KvEventRecord]) -> list[tuple[int, list[KvEventRecord]]]:
    """Consecutive runs of one data-parallel rank, in order (a batch names one rank)."""
    runs: list[tuple[int, list[KvEventRecord]]] = []
    for rec in records:
        rank = rec.event.dp_rank
        if runs and runs[-1][0] == rank:
            runs[-1][1].append(rec)
        else:
            runs.append((rank, [rec]))
    return runs
