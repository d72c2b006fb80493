"""A client that stops reading gives its admission slots back (issue 40, item 3), on the real
server: a raw socket sends a streaming request with n=8 and never reads (a tiny receive
buffer), so once the socket's buffers fill, uvicorn's send() waits for a drain that never
comes. Before --sse-write-timeout the stream, and its 8 slots, stayed for as long as the socket
stayed open (90 s in the issue, the engine idle all along): with the admission limit at 8 here,
every other client got 503 meanwhile. Now the stream ends after the write timeout, its engine
requests are aborted and its slots come back; victims beside it are served with their answers."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.ops_client import MODEL
from tests.e2e.server import Server
from tests.e2e.victims import VICTIM_PROMPTS, alone, chat

WRITE_TIMEOUT_S = 3.0
# Chunks of about 1 KB per choice and token (20 top logprobs): 8 x 300 of them are a few MB,
# more than the loopback socket buffers and uvicorn's 64 KiB write buffer hold.
ATTACK = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
    "n": 8,
    "max_tokens": 300,
    "ignore_eos": True,
    "temperature": 1.0,
    "seed": 3,
    "logprobs": True,
    "top_logprobs": 20,
    "stream": True,
}


@pytest.fixture(scope="module")
def small_server(log_dir: Path) -> Iterator[Server]:
    """Admission limit 8 (a batch of 8, nothing queued): one attacker with n=8 fills it."""
    args = ["--num-kv-blocks", "512", "--max-batch-size", "8", "--max-queued-requests", "0"]
    srv = Server(args=[*args, "--sse-write-timeout", str(WRITE_TIMEOUT_S)]).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def _attacker(port: int) -> socket.socket:
    """The request sent on a socket that will never be read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    body = json.dumps(ATTACK).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


async def _served(client: httpx.AsyncClient, url: str, prompt: str, deadline: float) -> str:
    """A victim that retries a 503 (as SDKs do) until the deadline."""
    while True:
        r = await client.post(f"{url}/v1/chat/completions", json=chat(prompt))
        if r.status_code != 503 or time.monotonic() > deadline:
            assert r.status_code == 200, r.text
            return str(r.json()["choices"][0]["message"]["content"])
        await asyncio.sleep(0.25)


async def test_a_client_that_never_reads_gives_its_slots_back(small_server: Server) -> None:
    srv = small_server
    in_flight = "trtllm_gateway:num_requests_in_flight"
    running = "trtllm_gateway:num_requests_running"
    async with httpx.AsyncClient(timeout=120) as client:
        expected = await alone(client, srv.url)
        sock = await asyncio.to_thread(_attacker, srv.port)
        try:
            t0 = time.monotonic()
            while srv.metric(in_flight) < 8:  # admitted: the limit is full
                assert time.monotonic() - t0 < 60
                await asyncio.sleep(0.1)
            # Victims beside it, retrying their 503s for at most 180 s: the attacker's 8 x 300
            # tokens may all be computed before its socket's buffers fill, which took past 60 s
            # on a contended 2-core machine once (how long its slots outlive the engine's work
            # is what is asserted below).
            beside = asyncio.gather(
                *(_served(client, srv.url, p, time.monotonic() + 180) for p in VICTIM_PROMPTS)
            )
            # When the engine went idle (its 8 x 300 tokens done, or aborted), and when the
            # attacker's slots came back.
            idle_at = freed_at = None
            busy = False
            while freed_at is None and not beside.done():
                now = time.monotonic()
                busy = busy or srv.metric(running) > 0
                if busy and idle_at is None and srv.metric(running) == 0:
                    idle_at = now
                if srv.metric(in_flight) < 8:
                    freed_at = now
                    idle_at = idle_at or now
                await asyncio.sleep(0.1)
            got = await beside
            assert got == expected
            assert idle_at is not None
            assert freed_at is not None
            held = freed_at - idle_at
            print(f"slots held {held:.1f} s after the engine went idle, {freed_at - t0:.1f} s all")
            assert held < WRITE_TIMEOUT_S + 3, held
            assert srv.metric(in_flight) == 0
            assert "stream ended" in srv.log()
        finally:
            sock.close()
