"""Bounded soak (`make soak`, not in CI): many requests at a fixed concurrency with random client
cancels against a real built-in-engine server; pass = 0 server errors, RSS flat within 10% after
warm-up, no KV blocks or requests left in the engine at the end, no descriptors left open past
the start (the gateway and its engine core), and, when it started the server, no process and no
ipc:// socket directory (gateway-core-* in its private TMPDIR) and no /dev/shm segment it made
left after the server's exit.

    python -m bench.soak [--requests 10000] [--concurrency 64] [--cancel-rate 0.2]
                         [--max-tokens 32] [--url URL --pid PID] [-- serve flags...]

Without --url it starts `python -m trtllm_gateway serve` itself (flags after `--` are passed
to it) and
stops it with SIGTERM at the end (a drain, checked to exit 0). Prints one JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Tell me about the sea.",
    "Write a haiku about autumn.",
    "Explain continuous batching in one paragraph.",
    "List five prime numbers and say why they are prime.",
    "What is a KV cache?",
]


@dataclass
class Tally:
    statuses: Counter[str] = field(default_factory=Counter)
    cancelled: int = 0
    completed: int = 0
    transport_errors: int = 0
    done: int = 0

    @property
    def server_errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s.startswith("5") and s != "503")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.eE+-]+)$", line)
        if m:
            total += float(m.group(2))
    return total


async def _one(
    client: httpx.AsyncClient, url: str, rng: random.Random, args: Any, t: Tally
) -> None:
    stream = rng.random() < 0.7
    body = {
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": rng.randint(1, args.max_tokens),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
        "stream": stream,
    }
    cancel_after = rng.uniform(0.0, 1.0) if rng.random() < args.cancel_rate else None
    try:
        async with asyncio.timeout(cancel_after):
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                t.statuses[str(r.status_code)] += 1
                async for _ in r.aiter_bytes():
                    pass
        t.completed += 1
    except TimeoutError:
        t.cancelled += 1
    except httpx.HTTPError:
        t.transport_errors += 1
    finally:
        t.done += 1


async def _sample_rss(pid: int, samples: list[tuple[int, float]], tally: Tally) -> None:
    proc = psutil.Process(pid)
    while True:
        rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(True))
        samples.append((tally.done, rss / 2**20))
        await asyncio.sleep(1.0)


def _fds(pid: int) -> int:
    """Open descriptors of the server and its children (the engine core)."""
    proc = psutil.Process(pid)
    return sum(p.num_fds() for p in (proc, *proc.children(True)))


async def _wait_idle(
    client: httpx.AsyncClient, url: str, limit_s: float = 30.0
) -> dict[str, float]:
    names = (
        "trtllm_gateway:num_requests_running",
        "trtllm_gateway:num_requests_waiting",
        "trtllm_gateway:kv_cache_usage_perc",
        "trtllm_gateway:num_requests_in_flight",
    )
    deadline = time.monotonic() + limit_s
    while True:
        text = (await client.get(f"{url}/metrics")).text
        values = {n.split(":", 1)[1]: _metric(text, n) for n in names}
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        await asyncio.sleep(0.2)


def _rss_verdict(samples: list[tuple[int, float]], total: int) -> dict[str, Any]:
    """Median RSS just after warm-up (10-20% of requests) against the last 10%."""
    warm = [mb for done, mb in samples if 0.1 * total <= done < 0.2 * total]
    tail = [mb for done, mb in samples if done >= 0.9 * total]
    if not warm or not tail:
        return {"rss_flat": None, "rss_samples": len(samples)}
    start, end = statistics.median(warm), statistics.median(tail)
    return {
        "rss_after_warmup_mb": round(start, 1),
        "rss_end_mb": round(end, 1),
        "rss_growth": round(end / start - 1, 4),
        "rss_flat": end <= start * 1.10,
    }


async def soak(args: Any, url: str, pid: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tally = Tally()
    samples: list[tuple[int, float]] = []
    limits = httpx.Limits(max_connections=args.concurrency + 8)
    fds_before = _fds(pid)
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        sampler = asyncio.create_task(_sample_rss(pid, samples, tally))
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(args.requests):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                await _one(client, url, rng, args, tally)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        elapsed = time.monotonic() - t0
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        idle = await _wait_idle(client, url)
    leaked = idle["kv_cache_usage_perc"] > 0 or idle["num_requests_running"] > 0
    await asyncio.sleep(2.0)  # closed connections' sockets go away
    fds_after = _fds(pid)
    summary: dict[str, Any] = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "cancel_rate": args.cancel_rate,
        "elapsed_s": round(elapsed, 1),
        "requests_per_s": round(args.requests / elapsed, 1),
        "completed": tally.completed,
        "client_cancelled": tally.cancelled,
        "statuses": dict(tally.statuses),
        "server_errors": tally.server_errors,
        "transport_errors": tally.transport_errors,
        "idle_after": idle,
        "leaked_kv": leaked,
        "fds_before_after": [fds_before, fds_after],
        **_rss_verdict(samples, args.requests),
    }
    summary["passed"] = (
        summary["server_errors"] == 0
        and tally.transport_errors == 0
        and not leaked
        and fds_after <= fds_before + 4  # a few idle keep-alive sockets may remain
        and summary.get("rss_flat") is not False
    )
    return summary


def _start_server(port: int, serve_args: list[str], tmp: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "trtllm_gateway", "serve", "--port", str(port), *serve_args]
    log = open(os.environ.get("SOAK_LOG", "/tmp/trtllm-gateway-soak.log"), "wb")  # noqa: SIM115
    env = {**os.environ, "TMPDIR": tmp}  # its socket directory is found (or not) here
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, env=env)


def _shm() -> set[str]:
    """The shared memory segments now (the core hands large blobs over in /dev/shm)."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.iterdir()} if shm.is_dir() else set()


def _left_behind(children: list[int], tmp: str, shm_before: set[str]) -> dict[str, Any]:
    """What outlived the server: its processes, socket directories and shared memory segments
    (after a short grace)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [c for c in children if psutil.pid_exists(c)]
        dirs = [p.name for p in Path(tmp).glob("gateway-core-*")]
        shm = sorted(_shm() - shm_before)
        if not alive and not dirs and not shm:
            break
        time.sleep(0.2)
    return {"processes_left": alive, "socket_dirs_left": dirs, "shm_left": shm}


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit("server not ready")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, serve_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--cancel-rate", type=float, default=0.2)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", help="an already running server (then --pid for its RSS)")
    p.add_argument("--pid", type=int)
    args = p.parse_args(own)
    proc = None
    children: list[int] = []
    tmp = tempfile.mkdtemp(prefix="soak-")
    shm_before = _shm()
    if args.url:
        url, pid = args.url.rstrip("/"), args.pid or 0
        if not pid:
            raise SystemExit("--url needs --pid (to watch the server's RSS)")
    else:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = _start_server(port, serve_args or ["--num-kv-blocks", "1024"], tmp)
        pid = proc.pid
        _wait_ready(url, proc)
        children = [c.pid for c in psutil.Process(pid).children(True)]
    try:
        summary = asyncio.run(soak(args, url, pid))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
    if proc is not None:
        left = _left_behind(children, tmp, shm_before)
        summary |= {"server_exit_code": code, **left}
        clean = not any(left.values())
        summary["passed"] = summary["passed"] and code == 0 and clean
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
