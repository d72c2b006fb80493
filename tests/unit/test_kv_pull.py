"""engine/disagg/kv_stream.py's KvPull: protocol v2's KV stream read with http.client on a
thread, against a real HTTP server on loopback (a stdlib one whose answers each test picks):
the bytes land where place() says, a non-200 answer or an oversized Content-Length is refused
before any payload, and abort() or the deadline ends a stalled read at once."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trtllm_gateway.engine.disagg import kv_stream
from trtllm_gateway.engine.disagg.kv_wire import KvWireError
from trtllm_gateway.engine.kv_region import KvRegion

LAYOUT = "llama:2x1x4:torch.float32:bs16"
REGION = KvRegion(
    transport="shm", arena="tgkv_x", offset=4096, nbytes=2 * 2 * 40 * 4 * 4,
    shape=(2, 2, 40, 1, 4), dtype="torch.float32", kv_layout=LAYOUT,
)  # fmt: skip
Answer = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Answer) -> str:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                answer(self)

            def log_message(self, *args: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/internal/v2/kv/ctx-1"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def stream_of(data: bytes) -> bytes:
    async def collect() -> bytes:
        return b"".join([bytes(f) async for f in kv_stream.frames(REGION, memoryview(data))])

    return asyncio.run(collect())


def answer_with(body: bytes, status: int = 200, length: int | None = None) -> Answer:
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        h.end_headers()
        h.wfile.write(body)

    return answer


def no_check(r: KvRegion) -> None:
    pass


def test_the_stream_lands_where_place_says(serve: Callable[[Answer], str]) -> None:
    data = os.urandom(REGION.nbytes)
    seen: dict[str, str] = {}

    def answer(h: BaseHTTPRequestHandler) -> None:
        seen["auth"] = h.headers.get("Authorization", "")
        answer_with(stream_of(data))(h)

    url = serve(answer)
    arena = bytearray(4096 + REGION.nbytes)
    pull = kv_stream.KvPull(url, {"Authorization": "Bearer k"}, 1 << 20, 10.0)
    got = pull.run(no_check, lambda r: memoryview(arena)[4096 : 4096 + r.nbytes])
    assert got.shape == REGION.shape and got.transport == "frame"
    assert bytes(arena[4096:]) == data and arena[:4096] == bytes(4096)
    assert seen["auth"] == "Bearer k"


def test_a_non_200_answer_is_a_pull_error_with_its_status(
    serve: Callable[[Answer], str],
) -> None:
    url = serve(answer_with(b"no such hand-off", status=404))
    with pytest.raises(kv_stream.KvPullError, match="404: no such hand-off") as e:
        kv_stream.KvPull(url, {}, None, 10.0).run(no_check, lambda r: pytest.fail("placed"))
    assert e.value.status == 404


def test_a_declared_length_past_the_cap_is_refused_before_the_payload(
    serve: Callable[[Answer], str],
) -> None:
    url = serve(answer_with(stream_of(bytes(REGION.nbytes))))
    with pytest.raises(kv_stream.KvPullError, match="more than 100"):
        kv_stream.KvPull(url, {}, 100, 10.0).run(no_check, lambda r: pytest.fail("placed"))


def test_a_stream_cut_short_is_a_wire_error(serve: Callable[[Answer], str]) -> None:
    full = stream_of(bytes(REGION.nbytes))
    short = answer_with(full[:-40], length=len(full))

    def answer(h: BaseHTTPRequestHandler) -> None:
        short(h)
        h.close_connection = True  # the sibling goes away mid-stream

    url = serve(answer)
    with pytest.raises((KvWireError, kv_stream.KvPullError)):
        kv_stream.KvPull(url, {}, None, 10.0).run(
            no_check, lambda r: memoryview(bytearray(r.nbytes))
        )


def stalled(release: threading.Event) -> Answer:
    """Sends the header and half the payload, then waits."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        full = stream_of(bytes(REGION.nbytes))
        h.send_response(200)
        h.send_header("Content-Length", str(len(full)))
        h.end_headers()
        h.wfile.write(full[: len(full) // 2])
        h.wfile.flush()
        release.wait(30)

    return answer


def test_abort_ends_a_stalled_pull_at_once(serve: Callable[[Answer], str]) -> None:
    release = threading.Event()
    url = serve(stalled(release))
    pull = kv_stream.KvPull(url, {}, None, 60.0)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pull.run(no_check, lambda r: memoryview(bytearray(r.nbytes)))
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    pull.abort()
    t.join(5)
    release.set()
    assert not t.is_alive() and time.monotonic() - t0 < 2.0
    assert errors and isinstance(errors[0], (kv_stream.KvPullError, KvWireError))


def test_the_deadline_bounds_a_stalled_pull(serve: Callable[[Answer], str]) -> None:
    release = threading.Event()
    url = serve(stalled(release))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        kv_stream.KvPull(url, {}, None, 1.0).run(
            no_check, lambda r: memoryview(bytearray(r.nbytes))
        )
    release.set()
    assert time.monotonic() - t0 < 5.0


def test_a_refused_connection_is_a_pull_error() -> None:
    with pytest.raises(kv_stream.KvPullError):
        kv_stream.KvPull("http://127.0.0.1:9/kv", {}, None, 5.0).run(
            no_check, lambda r: pytest.fail("placed")
        )
