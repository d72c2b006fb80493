"""app/http_protocol.py: uvicorn's httptools protocol with the request head bounded, served for
real on loopback (a tiny ASGI app echoing the body's size): a head past the bound is a 400 and a
closed connection whether it comes whole or a byte at a time; a head just under it, a large body
in the same write as its head, and keep-alive requests after one another all pass."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from trtllm_gateway.app.http_protocol import bounded_protocol

LIMIT = 4096


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        msg = await receive()
        size += len(msg.get("body", b""))
        more = msg.get("more_body", False)
    body = str(size).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    config = uvicorn.Config(app, port=0, log_level="error", http=bounded_protocol(LIMIT))
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.02)
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    t.join(10)


def exchange(port: int, *parts: bytes, pause: float = 0.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            for part in parts:
                s.sendall(part)
                if pause:
                    time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed on us: its answer is read below
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                if out.count(b"\r\n\r\n") and _complete(out):
                    break
        except ConnectionResetError:
            pass
        return out


def _complete(out: bytes) -> bool:
    head, _, body = out.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def get(extra: int) -> bytes:
    return b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * extra + b"\r\n\r\n"


def test_a_head_under_the_bound_is_served(port: int) -> None:
    assert exchange(port, get(LIMIT - 200)).startswith(b"HTTP/1.1 200")


def test_a_head_past_the_bound_in_one_write_is_a_400(port: int) -> None:
    answer = exchange(port, get(LIMIT + 10))
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert b"connection: close" in answer.lower()


def test_a_head_that_never_ends_is_refused_at_the_bound(port: int) -> None:
    """A header value sent in pieces with no line end: httptools would buffer it all."""
    start = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: "
    t0 = time.monotonic()
    answer = exchange(port, start, *([b"a" * 1024] * 64), pause=0.005)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert time.monotonic() - t0 < 5


def test_a_large_body_in_the_same_write_as_its_head_is_not_head(port: int) -> None:
    body = b"x" * (LIMIT * 16)
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    answer = exchange(port, head + body)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(str(len(body)).encode())


def test_keep_alive_requests_each_get_their_own_bound(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for _ in range(5):
            s.sendall(get(LIMIT - 200))
            out = b""
            while not _complete(out):
                out += s.recv(65536)
            assert out.startswith(b"HTTP/1.1 200")
