"""bench.serve's two HTTP clients read the same event stream the same way: chunks, TTFT and gaps,
usage, a mid-stream error, and a refused request."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from aiohttp import web

from bench.serve import worker_main

CHUNKS = 5


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("max_tokens") == 0:
        return web.json_response({"error": {"message": "max_tokens"}}, status=400)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(CHUNKS):
        chunk = {"choices": [{"index": 0, "text": f"t{i}"}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await asyncio.sleep(0.002)
    if body.get("fail"):
        await resp.write(b'data: {"error": {"message": "engine failed"}}\n\n')
        return resp
    usage = {"choices": [], "usage": {"completion_tokens": CHUNKS, "prompt_tokens": 3}}
    await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return resp


async def _run(client: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    job = {
        "base_url": f"http://127.0.0.1:{port}",
        "endpoint": "/v1/completions",
        "client": client,
        "concurrency": 2,
        "start_at": 0.0,
        "requests": [(0.0, b) for b in bodies],
    }
    try:
        return await worker_main(job, itertools.count().__next__)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_clients_read_streams_alike(client: str) -> None:
    bodies = [{"max_tokens": 5}, {"max_tokens": 5, "fail": True}, {"max_tokens": 0}]
    results = asyncio.run(_run(client, bodies * 2))
    assert len(results) == 6
    ok = [r for r in results if r["ok"]]
    assert len(ok) == 2
    for r in ok:
        assert r["output_tokens"] == CHUNKS and r["prompt_tokens"] == 3
        assert len(r["itl"]) == CHUNKS - 1 and all(g > 0 for g in r["itl"])
        assert 0 < r["ttft"] <= r["latency"] and r["end"] - r["start"] == r["latency"]
    errors = sorted(r["error"] for r in results if not r["ok"])
    assert [e.startswith("HTTP 400") for e in errors].count(True) == 2
    assert errors.count("{'message': 'engine failed'}") == 2


def test_steady_counts_the_chunks_while_every_lane_is_busy() -> None:
    """bench.serve's `steady`: from when the first `concurrency` requests all have their first
    token to when the last request starts; the run's ramp and drain are left out."""
    from bench.serve import steady

    def req(start: float, ttft: float, itl: list[float]) -> dict[str, Any]:
        return {"start": start, "ttft": ttft, "itl": itl}

    ok = [
        req(0.0, 1.0, [1.0, 1.0, 1.0]),  # chunks at 1, 2, 3, 4
        req(0.0, 2.0, [1.0, 1.0]),  # 2, 3, 4
        req(4.0, 1.0, [1.0]),  # 5, 6
        req(5.0, 1.0, []),  # 6: after the window
    ]
    got = steady(ok, 2)
    assert got is not None
    assert got["window_s"] == 3.0 and got["from_s"] == 2.0  # [2, 5]
    assert got["chunk_throughput"] == pytest.approx(7 / 3)
    assert steady(ok[:2], 2) is None  # no request waited for a lane: no steady window
    assert steady([req(0.0, 9.0, []), req(0.0, 1.0, []), req(3.0, 1.0, [])], 2) is None


def test_spawned_clients_open_their_lanes_together() -> None:
    """Every client process's lanes start at one barrier: none waits for the processes spawned
    before it to come up (which spread a 16-process run's start over ~8 s)."""
    import threading

    from bench.serve import _spawned, ramp

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        job = {"base_url": f"http://127.0.0.1:{port}", "endpoint": "/v1/completions"}
        jobs = [{**job, "client": "aiohttp", "concurrency": 2} for _ in range(3)]
        results = _spawned(jobs, [(0.0, {"max_tokens": 5})] * 9)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert len(results) == 9 and all(r["ok"] for r in results)
    # Six lanes in three processes: the sixth request starts with the first, not a process's
    # start-up (~0.5 s on a 2-core machine) after it.
    assert ramp(results, 6) < 0.25


def _explode() -> None:
    raise RuntimeError("this client process dies as it starts")


class _DiesInTheChild:
    """Unpickled in the spawned process by calling _explode: that process dies before the
    barrier."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_explode, ())


def test_a_client_process_that_dies_fails_the_run() -> None:
    """A process that dies before the barrier ends the run with an error, and its sibling,
    waiting at the barrier, is stopped: not a wait for ever there and on the results queue."""
    from bench.serve import _spawned

    job = {"base_url": "http://127.0.0.1:9", "endpoint": "/v1/completions", "concurrency": 1}
    jobs = [job, {**job, "dies": _DiesInTheChild()}]
    with pytest.raises(RuntimeError, match="client process exited"):
        _spawned(jobs, [(0.0, {"max_tokens": 1})])
