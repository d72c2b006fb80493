"""Once a second: CPU of a server's processes and threads, of the load generator, and the
engine's running/waiting gauges, while a benchmark runs.

Why: over HTTP at one token per chunk the question is which side saturates first: the
gateway's event loop (its main thread), the engine loop (a thread of the gateway with
--no-engine-process, its own process otherwise) or the client. A process's CPU % over 100 is
several threads; a thread at ~100% is the one that cannot go faster.

  python -m bench.proc_sample --pid SERVER --client-pid BENCH \\
      --metrics-url http://127.0.0.1:8123/metrics > samples.jsonl   # until SIGTERM

One JSON object a line; `summary(path)` averages the lines with every slot busy.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

_GAUGE = re.compile(r"^trtllm_gateway:num_requests_(running|waiting)\{[^}]*\} (\S+)$", re.M)


def _thread_times(proc: psutil.Process) -> dict[int, float]:
    try:
        return {t.id: t.user_time + t.system_time for t in proc.threads()}
    except psutil.Error:
        return {}


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _is_core(proc: psutil.Process) -> bool:
    return _runs(proc, "engine.transport")


def _runs(proc: psutil.Process, module: str) -> bool:
    try:
        return any(module in part for part in proc.cmdline())
    except psutil.Error:
        return False


class _Cpu:
    """CPU % of each process and thread since the previous call, by pid and thread id."""

    def __init__(self) -> None:
        self._last: dict[int, dict[int, float]] = {}

    def percent(self, procs: list[psutil.Process], dt: float) -> dict[int, dict[int, float]]:
        out: dict[int, dict[int, float]] = {}
        for p in procs:
            now = _thread_times(p)
            before = self._last.get(p.pid, {})
            out[p.pid] = {tid: 100 * (t - before.get(tid, t)) / dt for tid, t in now.items()}
            self._last[p.pid] = now
        return out


def _process_row(pid: int, threads: dict[int, float]) -> dict[str, float]:
    """Total, the main thread (the gateway's event loop) and the busiest other thread."""
    others = [v for tid, v in threads.items() if tid != pid]
    return {
        "cpu": round(sum(threads.values()), 1),
        "main": round(threads.get(pid, 0.0), 1),
        "top_other": round(max(others, default=0.0), 1),
        "threads": len(threads),
    }


def _gauges(client: httpx.Client, url: str) -> dict[str, float]:
    try:
        text = client.get(url, timeout=2.0).text
    except httpx.HTTPError:
        return {}
    return {name: float(value) for name, value in _GAUGE.findall(text)}


def sample(pid: int, client_pid: int | None, metrics_url: str | None, interval: float) -> None:
    cpu = _Cpu()
    http = httpx.Client()
    t0 = last = time.monotonic()
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    while not stop and psutil.pid_exists(pid):
        time.sleep(interval)
        now = time.monotonic()
        dt, last = now - last, now
        server = _tree(pid)
        clients = _tree(client_pid) if client_pid else []
        pct = cpu.percent(server + clients, dt)
        row: dict[str, Any] = {"t": round(now - t0, 2)}
        if server:
            row["gateway"] = _process_row(pid, pct[pid])
            core = next((p.pid for p in server[1:] if _is_core(p)), None)
            if core:  # --engine-process: the step loop's own process
                row["core"] = _process_row(core, pct[core])
            # --api-server-count N: "gateway" is the idle supervisor, the event loops are these.
            apis = [p.pid for p in server[1:] if _runs(p, "app.api_server")]
            if apis:
                row["api_servers"] = [_process_row(api, pct[api]) for api in apis]
        if clients:
            row["client_cpu"] = round(sum(sum(pct[p.pid].values()) for p in clients), 1)
        if metrics_url:
            row.update(_gauges(http, metrics_url))
        print(json.dumps(row), flush=True)


def _mean(rows: list[dict[str, Any]], *keys: str) -> float | None:
    vals: list[float] = []
    for r in rows:
        v: Any = r
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if isinstance(v, int | float):
            vals.append(float(v))
    return round(sum(vals) / len(vals), 1) if vals else None


def summary(path: Path) -> dict[str, Any]:
    """Means over the samples with the most requests running (every slot busy): the steady
    state, without the ramp-up and the tail, which every run has and which would dilute it."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return {}
    peak = max((r.get("running") or 0 for r in rows), default=0)
    busy = [r for r in rows if peak and r.get("running") == peak]
    if not busy:
        return {}
    servers = [r["api_servers"] for r in busy if r.get("api_servers")]
    n = min((len(a) for a in servers), default=0)
    return {
        # --api-server-count N: each server's main thread (how evenly the port spreads the load)
        "api_main": [
            round(sum(a[i].get("main") or 0 for a in servers) / len(servers), 1) for i in range(n)
        ],
        "samples": len(busy),
        "running": _mean(busy, "running"),
        "waiting": _mean(busy, "waiting"),
        "gateway_cpu": _mean(busy, "gateway", "cpu"),
        "gateway_main": _mean(busy, "gateway", "main"),
        "gateway_top_other": _mean(busy, "gateway", "top_other"),
        "core_cpu": _mean(busy, "core", "cpu"),
        "core_main": _mean(busy, "core", "main"),
        "client_cpu": _mean(busy, "client_cpu"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pid", type=int, help="the server (gateway) process")
    p.add_argument("--client-pid", type=int, default=None, help="the load generator")
    p.add_argument("--metrics-url", default=None)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--summary", type=Path, default=None, help="print summary(file) and exit")
    args = p.parse_args()
    if args.summary:
        print(json.dumps(summary(args.summary)))
        return
    if args.pid is None:
        sys.exit("--pid is required")
    sample(args.pid, args.client_pid, args.metrics_url, args.interval)


if __name__ == "__main__":
    main()
