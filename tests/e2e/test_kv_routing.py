"""Three real processes: two prefill siblings and a decode instance that follows their KV events.

The sibling that already holds a long prompt's prefix gets the next request sharing it (not the
idle one), and that request's TTFT is lower than a cold prompt's of the same length. Also: the
event stream's content against what was prefilled, its auth, /internal/v1/load, and the same
events on a ZMQ PUB socket (--kv-events-zmq) in the msgpack batch format.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq

from tests.e2e.ops_client import INTERNAL_AUTH, INTERNAL_KEY
from tests.e2e.server import Server, free_port
from tests.upstream.dynamo_zmq_wire import decode_batch
from trtllm_gateway.engine.kv_events.wire import unsigned64

KEY = "kv-routing-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG, SHARED = 1536, 1408  # prompt tokens; tokens a follow-up shares with the first prompt
BS = 16


def _prompt(seed: int, n: int = LONG) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(100, 30000) for _ in range(n)]


def _ttft(url: str, prompt: list[int]) -> float:
    """Seconds to the first streamed token of a /v1/completions request."""
    body = {"prompt": prompt, "max_tokens": 2, "stream": True, "temperature": 0}
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200, r.read()
        first = None
        for line in r.iter_lines():
            if first is None and line.startswith("data:") and '"choices"' in line:
                first = time.perf_counter() - t0
    assert first is not None
    return first


def _events(url: str, after: int = -1) -> list[dict[str, object]]:
    r = httpx.get(
        f"{url}/internal/v1/kv-events",
        params={"after": after, "follow": "false", "token_ids": "true"},
        headers=INTERNAL_AUTH,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def _stored_tokens(events: list[dict[str, object]]) -> list[int]:
    return [t for e in events if e["type"] == "BlockStored" for t in e["token_ids"]]  # type: ignore[attr-defined]


class ZmqSub:
    """A bound SUB socket read by a thread: a SUB sends its subscription to a PUB that connects
    only while its own thread calls into it, as a real router's reader does all the time."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.port = free_port()
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.messages: list[list[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(timeout=50):
                self.messages.append(self.sock.recv_multipart())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture(scope="module")
def zmq_sub() -> Iterator[ZmqSub]:
    sub = ZmqSub()
    yield sub
    sub.close()


@pytest.fixture(scope="module")
def three(log_dir: Path, zmq_sub: ZmqSub) -> Iterator[list[Server]]:
    common = ["--num-kv-blocks", "512", "--api-key", KEY, "--log-level", "warning"]
    common += ["--internal-api-key", INTERNAL_KEY]
    zmq_addr = f"tcp://127.0.0.1:{zmq_sub.port}"
    p1 = Server(args=["--mode", "prefill", *common, "--kv-events-zmq", zmq_addr])
    p2 = Server(args=["--mode", "prefill", *common])
    for p in (p1, p2):
        p.start(log_dir, wait=False)
    for p in (p1, p2):
        p.wait_ready()
    urls = f"{p1.url},{p2.url}"
    d = Server(
        args=[
            "--mode", "decode", "--prefill-url", urls, "--max-local-prefill-tokens", "0", *common,
        ]
    ).start(log_dir)  # fmt: skip
    yield [p1, p2, d]
    for s in (d, p1, p2):
        s.stop()


def test_events_stream_auth_and_load(three: list[Server]) -> None:
    p1 = three[0]
    assert httpx.get(f"{p1.url}/internal/v1/kv-events").status_code == 401
    assert httpx.get(f"{p1.url}/internal/v1/load").status_code == 401
    # A client key opens the public API only, never another user's prompt tokens.
    assert httpx.get(f"{p1.url}/internal/v1/kv-events", headers=AUTH).status_code == 401
    events = _events(p1.url)
    assert events[0]["type"] == "Hello" and events[0]["block_size"] == BS
    assert events[1]["type"] == "AllBlocksCleared" and events[1]["event_id"] == 0
    load = httpx.get(f"{p1.url}/internal/v1/load", headers=INTERNAL_AUTH).json()
    assert load["state"] == "ready" and load["kv_blocks_total"] == 512
    assert {"running", "waiting", "kv_usage", "kv_blocks_used"} <= set(load)
    # Idle: no block held by a request (the cached ones are free to evict).
    assert load["kv_active_blocks"] == load["kv_blocks_used"] == 0, load
    r = httpx.get(f"{p1.url}/internal/v1/kv-events", params={"after": -2}, headers=INTERNAL_AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"].endswith("after")


def test_sibling_with_the_prefix_gets_the_request(three: list[Server], zmq_sub: ZmqSub) -> None:
    p1, p2, d = three
    before = {p.url: p.metric("trtllm_gateway:prefix_cache_hits_total") for p in (p1, p2)}
    first = _prompt(1)
    cold = [_ttft(d.url, first)]
    holders = [
        p for p in (p1, p2) if _stored_tokens(_events(p.url))[: LONG - BS] == first[: LONG - BS]
    ]
    assert len(holders) == 1, "exactly one sibling prefilled the first prompt"
    holder, other = holders[0], p2 if holders[0] is p1 else p1
    time.sleep(1.0)  # the decode instance's follower reads the holder's stream

    warm = []
    for seed in (2, 3):
        follow_up = first[:SHARED] + _prompt(seed, LONG - SHARED)
        warm.append(_ttft(d.url, follow_up))
    cold.append(_ttft(d.url, _prompt(4)))  # a second cold prompt, the same length

    # Both follow-ups went to the holder (an idle sibling was there every time) ...
    hits = {
        p.url: p.metric("trtllm_gateway:prefix_cache_hits_total") - before[p.url] for p in (p1, p2)
    }
    assert hits[holder.url] >= 2 * (SHARED - BS), hits
    assert hits[other.url] == 0, hits
    assert d.metric("trtllm_gateway:kv_routing_choices_total", 'reason="prefix"') == 2
    assert d.metric("trtllm_gateway:kv_routing_hit_tokens_total", holder.url) >= 2 * (SHARED - BS)
    # ... and their time to first token is lower than a cold prompt's of the same length.
    print(f"TTFT cold {cold} s, routed to the cached prefix {warm} s")
    assert max(warm) < min(cold), (warm, cold)

    # p1's ZMQ socket carried the same stored blocks as its NDJSON stream (a context phase run
    # on p1 directly makes sure it stored some).
    body = {"protocol_version": 1, "request_id": "zmq-check", "prompt_token_ids": _prompt(5, 64)}
    r = httpx.post(f"{p1.url}/internal/v1/prefill", json=body, headers=INTERNAL_AUTH, timeout=60)
    assert r.status_code == 200, r.text
    httpx.delete(f"{p1.url}/internal/v1/kv/zmq-check", headers=INTERNAL_AUTH, timeout=10)
    time.sleep(0.5)
    hashes: list[int] = []
    for topic, seq, payload in zmq_sub.messages:
        assert topic == b"" and len(seq) == 8
        batch = decode_batch(payload)  # the default format, read by Dynamo's reader
        hashes += [h for ev in batch.events if ev.type == "BlockStored" for h in ev.block_hashes]
    stream = [
        unsigned64(h)
        for e in _events(p1.url)
        if e["type"] == "BlockStored"  # type: ignore[attr-defined]
        for h in e["block_hashes"]  # type: ignore[attr-defined]
    ]
    assert hashes == stream and stream, p1.log()
    # Sequence numbers run without a gap from the first message this subscriber saw. Message 0
    # (the start-up AllBlocksCleared) may be gone: a PUB drops what it sends before the TCP
    # connection and the subscription are through (ZMQ's slow joiner), as vLLM's publisher does.
    seqs = [int.from_bytes(m[1], "big") for m in zmq_sub.messages]
    assert seqs[0] <= 1 and seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
