"""SIGTERM drain against a real process: /health and new requests turn 503 at once; with a long
--shutdown-timeout every in-flight stream completes, with 0 each ends with finish_reason "abort"
and [DONE]; either way the process exits 0 with no child process left."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import psutil

from tests.e2e.ops_client import chat, stream_chat
from tests.e2e.server import Server, free_port

STREAMS = 4


async def _start_streams(
    client: httpx.AsyncClient, srv: Server, max_tokens: int
) -> list[asyncio.Task[object]]:
    started = [asyncio.Event() for _ in range(STREAMS)]
    tasks: list[asyncio.Task[object]] = [
        asyncio.create_task(stream_chat(client, srv.url, chat(max_tokens), started=ev))
        for ev in started
    ]
    async with asyncio.timeout(60):
        await asyncio.gather(*(ev.wait() for ev in started))
    return tasks


def _children(srv: Server) -> list[psutil.Process]:
    assert srv.proc is not None
    return psutil.Process(srv.proc.pid).children(recursive=True)


async def _exit_code(srv: Server, limit_s: float) -> int:
    assert srv.proc is not None
    return await asyncio.to_thread(srv.proc.wait, limit_s)


async def test_drain_finishes_in_flight_streams(log_dir: Path) -> None:
    srv = Server(args=["--num-kv-blocks", "256", "--shutdown-timeout", "60"]).start(log_dir)
    try:
        children = _children(srv)
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = await _start_streams(client, srv, max_tokens=32)
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            health = await client.get(f"{srv.url}/health")
            assert health.status_code == 503
            assert health.json()["status"] == "draining"
            late = await client.post(f"{srv.url}/v1/chat/completions", json=chat(4, stream=False))
            assert late.status_code == 503
            assert late.headers["retry-after"] == "1"
            results = await asyncio.gather(*tasks)
        for result in results:
            assert result.finish_reasons == ["length"], result  # type: ignore[attr-defined]
            assert result.done  # type: ignore[attr-defined]
        assert await _exit_code(srv, 30) == 0, srv.log()
        assert not [c for c in children if c.is_running()]
    finally:
        srv.stop(signal.SIGKILL)


async def test_zero_timeout_aborts_and_exits_fast(log_dir: Path) -> None:
    srv = Server(args=["--num-kv-blocks", "256", "--shutdown-timeout", "0"]).start(log_dir)
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = await _start_streams(client, srv, max_tokens=1500)
            assert srv.proc is not None
            t0 = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*tasks)
            code = await _exit_code(srv, 10)
            elapsed = time.monotonic() - t0
        for result in results:
            assert result.finish_reasons == ["abort"], result  # type: ignore[attr-defined]
            assert result.done  # type: ignore[attr-defined]
        assert code == 0, srv.log()
        assert elapsed < 5, elapsed
    finally:
        srv.stop(signal.SIGKILL)


def test_a_dead_trace_collector_does_not_hold_the_exit(log_dir: Path) -> None:
    """Issue 40, item 8: with traces on and the collector gone, SIGTERM took 12.7 s instead of
    3.0 s (the span flush retried its export for the exporter's 10 s timeout); the flush now
    gets at most 2 s."""
    dead = free_port()  # nothing listens: every export is refused and retried
    srv = Server(
        args=["--num-kv-blocks", "64", "--otlp-traces-endpoint", f"http://127.0.0.1:{dead}"]
    )
    srv.start(log_dir)
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={**chat(4), "stream": False}, timeout=60)
    assert r.status_code == 200, r.text  # a span queued for the dead collector
    t0 = time.monotonic()
    assert srv.stop() == 0, srv.log()
    took = time.monotonic() - t0
    print(f"exit {took:.1f} s after SIGTERM")
    # Here: 12.0 s before the bound, 6.8 s after (2 busy cores; the issue: 12.7 s and 3.0 s).
    assert took < 9.5, (took, srv.log())
