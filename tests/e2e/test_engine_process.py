"""--engine-process against a real server: the step loop in its own process.

Streams come out right; killing the engine process mid-stream gives the open stream an error
frame and [DONE], the server exits non-zero (an orchestrator restarts it) and leaves no process
behind; SIGTERM drains both processes and exits 0.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import psutil

from tests.e2e.ops_client import chat, stream_chat
from tests.e2e.server import Server

ARGS = ["--engine-process", "--num-kv-blocks", "256"]


def _alive(procs: list[psutil.Process], grace_s: float = 5.0) -> list[psutil.Process]:
    """Those still running after grace_s (the resource tracker exits once its pipe closes)."""
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def _children(srv: Server) -> list[psutil.Process]:
    assert srv.proc is not None
    return psutil.Process(srv.proc.pid).children(recursive=True)


def _engine_process(srv: Server) -> psutil.Process:
    assert srv.proc is not None
    children = psutil.Process(srv.proc.pid).children(recursive=True)
    cores = [c for c in children if "trtllm_gateway.engine.transport.process" in c.cmdline()]
    assert len(cores) == 1, [c.cmdline() for c in children]
    return cores[0]


async def test_engine_killed_mid_stream_error_frame_exit_nonzero_no_orphan(
    log_dir: Path,
) -> None:
    srv = Server(args=ARGS).start(log_dir)
    try:
        core = _engine_process(srv)
        children = _children(srv)  # the engine core
        async with httpx.AsyncClient(timeout=60) as client:
            ok = await stream_chat(client, srv.url, chat(8))
            assert ok.finish_reasons == ["length"] and ok.done, ok
            started = asyncio.Event()
            task = asyncio.create_task(stream_chat(client, srv.url, chat(2000), started=started))
            async with asyncio.timeout(60):
                await started.wait()
            core.kill()
            result = await asyncio.wait_for(task, 10)
        assert result.error is not None and result.done, result
        assert "exited" in result.error["message"], result.error
        assert srv.proc is not None
        code = await asyncio.to_thread(srv.proc.wait, 30)
        assert code == 3, srv.log()
        assert "the engine died" in srv.log()
        assert not _alive(children), [c.cmdline() for c in _alive(children)]
    finally:
        srv.stop(signal.SIGKILL)


async def test_sigterm_drains_both_processes(log_dir: Path) -> None:
    srv = Server(args=[*ARGS, "--shutdown-timeout", "60"]).start(log_dir)
    try:
        core = _engine_process(srv)
        children = _children(srv)  # the engine core
        async with httpx.AsyncClient(timeout=60) as client:
            started = [asyncio.Event() for _ in range(3)]
            tasks = [
                asyncio.create_task(stream_chat(client, srv.url, chat(32), started=ev))
                for ev in started
            ]
            async with asyncio.timeout(60):
                await asyncio.gather(*(ev.wait() for ev in started))
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGTERM)
            # A process-group signal reaches the engine too: it ignores it and keeps serving.
            core.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*tasks)
        for r in results:
            assert r.finish_reasons == ["length"] and r.done, r
        code = await asyncio.to_thread(srv.proc.wait, 30)
        assert code == 0, srv.log()
        assert not _alive(children), [c.cmdline() for c in _alive(children)]
    finally:
        srv.stop(signal.SIGKILL)
