"""--api-server-count 2 on the real default model: two API server processes on one port, one
engine core. Which process served a request is read from its access log line ("api-server-N ...
[request id] request {...}"), so each test knows both processes took part.

Both serve, and reuse of one X-Request-Id across them is fine; admission counts both servers'
requests (a request over the limit gets 503 from a server that holds fewer than the limit itself);
/metrics sums both servers' counters whichever answers, and shows the one core's gauges once;
SIGTERM drains both and leaves no process or run directory; the core or a server dying stops all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.ops_client import MODEL, StreamResult, chat, stream_chat
from tests.e2e.server import Server

CAPACITY = 3  # --max-batch-size 3, --max-queued-requests 0
ARGS = ["--api-server-count", "2", "--num-kv-blocks", "256", "--max-batch-size", str(CAPACITY)]
_ACCESS = re.compile(r" api-server-(\d) INFO trtllm_gateway\.access \[([^\]]+)\] request (\{.*\})")
RUN_DIR = "gateway-core-*"  # under the server's TMPDIR: each test gives its own


@pytest.fixture(scope="module")
def srv(log_dir: Path) -> Iterator[Server]:
    s = Server(args=[*ARGS, "--max-queued-requests", "0"]).start(log_dir)
    yield s
    assert s.stop() == 0, s.log()


def served(srv: Server) -> dict[str, tuple[int, int]]:
    """request id -> (the API server that answered, the status), from the access log."""
    assert srv.log_path is not None
    out = {}
    for line in srv.log_path.read_text(errors="replace").splitlines():
        m = _ACCESS.search(line)
        if m:
            out[m.group(2)] = (int(m.group(1)), json.loads(m.group(3))["status"])
    return out


def fresh() -> httpx.AsyncClient:
    """A client that opens a new connection per request (each is accepted by either server)."""
    return httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))


async def complete(client: httpx.AsyncClient, srv: Server, rid: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": "The sea", "max_tokens": 2}
    return await client.post(f"{srv.url}/v1/completions", json=body, headers={"x-request-id": rid})


async def wait_logged(srv: Server, rids: list[str]) -> dict[str, tuple[int, int]]:
    for _ in range(50):
        log = served(srv)
        if all(r in log for r in rids):
            return log
        await asyncio.sleep(0.1)
    raise AssertionError(f"not logged: {[r for r in rids if r not in served(srv)]}")


async def test_both_processes_serve_and_one_request_id_may_reach_both(srv: Server) -> None:
    tag = uuid.uuid4().hex[:8]
    async with fresh() as client:
        rids: list[str] = []
        for i in range(40):  # the kernel picks the accepting process: both come soon
            rids.append(f"{tag}-{i}")
            r = await complete(client, srv, rids[-1])
            assert r.status_code == 200, r.text
            if len({s for s, _ in (await wait_logged(srv, rids)).values()}) == 2:
                break
        log = await wait_logged(srv, rids)
        assert {log[r][0] for r in rids} == {0, 1}
        # The same client id on several connections at once: each is its own engine request
        # (ids are qualified per server inside the core), all complete.
        same = f"{tag}-same"
        rs = await asyncio.gather(*(complete(client, srv, same) for _ in range(CAPACITY)))
    assert [r.status_code for r in rs] == [200] * CAPACITY
    assert all(r.headers["x-request-id"] == same for r in rs)


async def test_admission_counts_both_servers(srv: Server) -> None:
    before = srv.metric("trtllm_gateway:admission_rejected_total", 'reason="queue_full"')
    tag = uuid.uuid4().hex[:8]
    started = [asyncio.Event() for _ in range(CAPACITY)]
    holders = [f"{tag}-hold-{i}" for i in range(CAPACITY)]
    refused: list[str] = []
    async with fresh() as client:
        streams = [
            asyncio.create_task(
                stream_chat(client, srv.url, chat(400), started=ev, headers={"x-request-id": r})
            )
            for ev, r in zip(started, holders, strict=True)
        ]
        async with asyncio.timeout(60):
            await asyncio.gather(*(ev.wait() for ev in started))
        for i in range(12):  # new connections land on either server: every one is refused
            refused.append(f"{tag}-over-{i}")
            r = await complete(client, srv, refused[-1])
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "queue_full"
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    log = await wait_logged(srv, holders + refused)
    holding = [sum(log[h][0] == s for h in holders) for s in (0, 1)]
    refusers = {log[r][0] for r in refused}
    # A server that held fewer than the limit itself refused: the count is both servers'.
    assert any(holding[s] < CAPACITY for s in refusers), (holding, refusers)
    after = srv.metric("trtllm_gateway:admission_rejected_total", 'reason="queue_full"')
    assert after - before == len(refused)


async def test_metrics_sum_both_servers_whichever_answers(srv: Server) -> None:
    name = "trtllm_gateway:request_success_total"
    async with fresh() as client:
        await asyncio.sleep(0.5)  # the previous tests' aborted streams have ended
        before = srv.metric(name)
        tag = uuid.uuid4().hex[:8]
        rids: list[str] = []
        # Both processes accept on one shared socket and whichever wakes first takes a
        # connection, so 8 in a row can all go to one (seen on CI): more until both answered.
        for _ in range(5):
            batch = [f"{tag}-{len(rids) + i}" for i in range(8)]
            for rid in batch:
                assert (await complete(client, srv, rid)).status_code == 200
            rids += batch
            log = await wait_logged(srv, rids)
            if {log[r][0] for r in rids} == {0, 1}:
                break
        assert {log[r][0] for r in rids} == {0, 1}, f"one process took all {len(rids)} connections"
        for _ in range(6):  # /metrics on new connections: answered by either process
            text = (await client.get(f"{srv.url}/metrics")).text
            total = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(name + "{")
            )
            assert total - before == len(rids)
            # The one core's gauges once, not once per server.
            running = [
                ln
                for ln in text.splitlines()
                if ln.startswith("trtllm_gateway:num_requests_running{")
            ]
            assert len(running) == 1, running


def _tree(srv: Server) -> list[psutil.Process]:
    assert srv.proc is not None
    return psutil.Process(srv.proc.pid).children(recursive=True)


def _ours(tmp: Path) -> list[Path]:
    """The run directories a test's gateway made (its TMPDIR is the test's own, so another
    gateway on the machine is not counted)."""
    return list(tmp.glob(RUN_DIR))


async def test_sigterm_drains_every_server_and_leaves_nothing(
    log_dir: Path, tmp_path: Path
) -> None:
    env = {"TMPDIR": str(tmp_path)}
    s = Server(args=[*ARGS, "--shutdown-timeout", "60"], env=env).start(log_dir)
    try:
        children = _tree(s)
        assert len(children) == 3  # the core and two API servers
        assert len(_ours(tmp_path)) == 1
        started = [asyncio.Event() for _ in range(CAPACITY)]
        async with fresh() as client:
            streams = [
                asyncio.create_task(stream_chat(client, s.url, chat(24), started=ev))
                for ev in started
            ]
            await _all_started(streams, started, 60, s)
            assert s.proc is not None
            s.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            for _ in range(4):  # new connections, either server: draining
                health = await client.get(f"{s.url}/health")
                assert health.status_code == 503 and health.json()["status"] == "draining"
                late = await client.post(f"{s.url}/v1/chat/completions", json=chat(2, stream=False))
                assert late.status_code == 503
            results = await asyncio.gather(*streams)
        for result in results:
            assert result.finish_reasons == ["length"] and result.done, result
        assert await asyncio.to_thread(s.proc.wait, 30) == 0, s.log()
        assert not [c for c in children if c.is_running()]
        assert not _ours(tmp_path), "the run directory was left behind"
    finally:
        s.stop(signal.SIGKILL)


async def _all_started(
    streams: list[asyncio.Task[StreamResult]],
    started: list[asyncio.Event],
    limit_s: float,
    s: Server,
) -> None:
    """Waits until every stream has its first token; a stream that ended first (an error status or
    frame) fails the test with its result and the server's log, not a bare timeout (a CI run timed
    out here once with nothing to read)."""
    waits = [asyncio.create_task(ev.wait()) for ev in started]
    try:
        async with asyncio.timeout(limit_s):
            while not all(w.done() for w in waits):
                pending = [t for t in (*waits, *streams) if not t.done()]
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                ended = [
                    t.result()
                    for t, w in zip(streams, waits, strict=True)
                    if t.done() and not w.done()
                ]
                assert not ended, f"a stream ended before its first token: {ended}\n{s.log()}"
    except TimeoutError:
        waiting = sum(not w.done() for w in waits)
        raise AssertionError(
            f"{waiting} streams had no token after {limit_s} s\n{s.log()}"
        ) from None
    finally:
        for w in waits:
            w.cancel()


@pytest.mark.parametrize("victim", ["core", "api-server"])
async def test_a_dead_process_stops_them_all(log_dir: Path, victim: str, tmp_path: Path) -> None:
    s = Server(args=ARGS, env={"TMPDIR": str(tmp_path)}).start(log_dir)
    try:
        children = _tree(s)
        core = [c for c in children if "engine.transport.process" in " ".join(c.cmdline())]
        servers = [c for c in children if "app.api_server" in " ".join(c.cmdline())]
        assert len(core) == 1 and len(servers) == 2
        (core[0] if victim == "core" else servers[1]).kill()
        t0 = time.monotonic()
        assert s.proc is not None
        code = await asyncio.to_thread(s.proc.wait, 30)
        assert code == (3 if victim == "core" else 1), s.log()
        assert time.monotonic() - t0 < 20
        psutil.wait_procs(children, timeout=5)
        assert not [c for c in children if c.is_running()]
        assert not _ours(tmp_path)
    finally:
        s.stop(signal.SIGKILL)


async def _watch_tree(
    s: Server, seen: set[psutil.Process], started: set[psutil.Process], limit_s: float
) -> int:
    """The supervisor's exit status; every process under it meanwhile is added to seen, the
    ones it started itself to started."""
    assert s.proc is not None
    deadline = time.monotonic() + limit_s
    while s.proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            seen.update(_tree(s))
            started.update(psutil.Process(s.proc.pid).children())
        await asyncio.sleep(0.05)
    return await asyncio.to_thread(s.proc.wait, 1)


async def test_startup_timeout_stops_them_all(log_dir: Path, tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}
    s = Server(args=[*ARGS, "--startup-timeout", "0.5"], env=env).start(log_dir, wait=False)
    try:
        seen: set[psutil.Process] = set()
        started: set[psutil.Process] = set()
        assert await _watch_tree(s, seen, started, 60) == 4, s.log()
        # The core and the two API servers. Below them a process of their own may come and go
        # (CI once caught the core's `c++ --version`: cpu_kernels/build.py, compiler_version):
        # each of those must be gone too, but they are not counted.
        assert len(started) == 3, started
        psutil.wait_procs(list(seen), timeout=5)
        assert not [c for c in seen if c.is_running()]
        assert not _ours(tmp_path)
    finally:
        s.stop(signal.SIGKILL)


async def test_a_killed_supervisor_leaves_no_orphan(log_dir: Path, tmp_path: Path) -> None:
    s = Server(args=ARGS, env={"TMPDIR": str(tmp_path)}).start(log_dir)
    children = _tree(s)
    s.kill()  # SIGKILL: no drain, no cleanup of its own
    _, alive = await asyncio.to_thread(psutil.wait_procs, children, 15)
    assert not alive, s.log()
    for _ in range(50):  # the orphaned core removes the run directory on its way out
        if not _ours(tmp_path):
            break
        await asyncio.sleep(0.1)
    assert not _ours(tmp_path)
