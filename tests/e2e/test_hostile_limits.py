"""Header and body bounds on the real server (issue 24, item 5), beside victims that keep their
answers: a 1 MB header block is refused before it is parsed further (h11 buffers at most
--max-header-bytes; httptools parsed a 128 MB one for 39 s before auth ran), a body past
--max-body-bytes is a 413 before it is buffered."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import httpx

from tests.e2e.server import Server
from tests.e2e.victims import alone, victims


def _send_raw(port: int, head: bytes, body_chunks: int = 0) -> tuple[bytes, float]:
    """Send a request head (then 1 MB chunks of a chunked body); the first answer bytes."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(head)
            for _ in range(body_chunks):
                sock.sendall(b"100000\r\n" + b"x" * 0x100000 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we were still sending
        answer = sock.recv(4096)
    return answer, time.monotonic() - t0


async def test_a_huge_header_is_refused_beside_victims(server: Server) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    async with httpx.AsyncClient(timeout=120) as client:
        expected = await alone(client, server.url)
        beside = asyncio.create_task(victims(client, server.url))
        answer, took = await asyncio.to_thread(_send_raw, server.port, head)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        assert took < 10, took
        assert await beside == expected
        assert (await client.get(f"{server.url}/health")).status_code == 200


async def test_an_endless_chunked_body_is_a_413_beside_victims(server: Server) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    async with httpx.AsyncClient(timeout=120) as client:
        expected = await alone(client, server.url)
        beside = asyncio.create_task(victims(client, server.url))
        # 200 chunks of 1 MB: more than --max-body-bytes (64 MB), refused at the limit.
        answer, _ = await asyncio.to_thread(_send_raw, server.port, head, 200)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"larger than" in answer
        assert await beside == expected


def test_a_killed_gateway_leaves_no_socket_directory(log_dir: Path, tmp_path: Path) -> None:
    """Issue 24, item 8: after a SIGKILL of the gateway its engine core exits (no orphan) and
    removes the ipc:// directory the gateway can no longer remove (/tmp/gateway-core-*)."""
    srv = Server(args=["--num-kv-blocks", "64"], env={"TMPDIR": str(tmp_path)}).start(log_dir)
    assert srv.proc is not None
    assert [p.name for p in tmp_path.glob("gateway-core-*")], "the core's sockets live here"
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(10)
    deadline = time.monotonic() + 30
    while list(tmp_path.glob("gateway-core-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(tmp_path.glob("gateway-core-*")), srv.log()
