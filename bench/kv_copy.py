"""The KV copy stage of one N-token prompt per transport, beside the raw bandwidths of this run.

    python -m bench.kv_copy                                   # CPU: shm, http; 135M's KV shape
    python -m bench.kv_copy --transports shm http nixl        # with NIXL (the nixl extra)
    python -m bench.kv_copy --model-shape 8b --tokens 2048 \\
        --prefill-device cuda:0 --decode-device cuda:1        # cuda_ipc, shm, http on two GPUs

Two processes, as a prefill and a decode core are: the exporter's KvTransferWorker gathers the
prompt's blocks (a shuffled block table) into its arena; the importer's worker copies the
region into its own reserved blocks (shm, cuda_ipc_arena). cuda_ipc is what cores on one host's
GPUs do: no gather, the exporter names the blocks in its shared pool and the importer reads
them across into its own (engine/builtin/kv_across.py). For http the importer does what the decode
side's API server and core do: KvPull reads protocol v2's stream over loopback (uvicorn serving
kv_stream.frames) into a receive arena, and the worker copies the region from there; nixl
(the nixl extra) READs the exporter's host arena into the receive arena the same way. The stage
is timed from the exporter's stage() to the importer's Loaded; the KV is random values in the
model's cache shape and dtype (weights play
no part in the copy). Printed beside it, measured in the same run: shared-memory memcpy, loopback
TCP in one Python stream, and on GPUs the peer copy and pinned D2H / H2D. Also the step thread's
time per hand-off (stage() and load(): the issue's < 0.1 ms target). One JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import msgspec
import numpy as np
import torch

SHAPES = {  # layers, kv heads, head dim, cache dtype (config/models/*.json)
    "135m": (30, 3, 64, torch.float32),
    "8b": (32, 8, 128, torch.bfloat16),
}
BS = 16


def _caches(shape: str, tokens: int, device: str, fill: bool) -> list[tuple[torch.Tensor, ...]]:
    layers, heads, dim, dtype = SHAPES[shape]
    slots = (2 * tokens // BS + 8) * BS
    kv = torch.zeros(layers, 2, slots, heads, dim, dtype=dtype, device=device)
    if fill:
        kv.normal_()
    return [(kv[i, 0], kv[i, 1]) for i in range(layers)]


def _layout(shape: str) -> str:
    layers, heads, dim, dtype = SHAPES[shape]
    return f"bench:{layers}x{heads}x{dim}:{dtype}:bs{BS}"


def _worker(shape: str, tokens: int, device: str, fill: bool, arena: int) -> Any:
    from trtllm_gateway.engine.builtin.kv_transfer_worker import KvTransferWorker

    done = threading.Event()
    caches = _caches(shape, tokens, device, fill)
    w = KvTransferWorker(caches, BS, torch.device(device), _layout(shape), arena, 600.0, done.set)  # type: ignore[arg-type]
    return w, done


def _wait(w: Any, done: threading.Event) -> Any:
    while True:
        got = w.done()
        if got:
            return got[0]
        done.wait(60)
        done.clear()


def exporter(conn: Connection, args: argparse.Namespace, port: int) -> None:
    """The prefill side: stage, hand the region over, free it when the importer is done."""
    arena = args.arena_mb << 20
    w, done = _worker(args.model_shape, args.tokens, args.prefill_device, True, arena)
    regions: dict[str, Any] = {}
    server = _serve_http(w, regions, port)
    nixl_info: Any = None
    blocks = args.tokens // BS + 1
    rng = np.random.default_rng(0)
    while True:
        msg = conn.recv()
        if msg is None:
            break
        transport, rid = msg
        table = [int(b) for b in rng.permutation(2 * blocks)[:blocks]]
        t0 = time.perf_counter()
        paged = w.pool_region(rid, table, args.tokens) if transport == "cuda_ipc" else None
        if paged is not None:  # the blocks are the region: nothing staged, nothing to wait for
            region = paged
        else:
            why = w.stage(rid, table, args.tokens, device=transport.startswith("cuda_ipc"))
            assert not why, why
            staged = _wait(w, done)
            assert staged.region is not None, staged.error
            region = regions[rid] = staged.region
        conn.send((msgspec.json.encode(region), time.perf_counter() - t0))
        if transport == "nixl" and nixl_info is None:  # the agent's metadata, sent once
            from trtllm_gateway.engine.disagg.kv_nixl import NixlEnd

            nixl_end = NixlEnd("prefill")
            arena = w.host_arena()
            nixl_info = nixl_end.expose(arena.name, arena.shm.buf)
            conn.send(msgspec.json.encode(nixl_info))
        conn.recv()  # the importer has copied it
        w.free(rid)
    conn.send(statistics.median(w.handoff_s) if w.handoff_s else 0.0)
    server.should_exit = True
    w.close()


def _serve_http(w: Any, regions: dict[str, Any], port: int) -> Any:
    """Protocol v2's GET /internal/v2/kv/{id} for the exporter's host arena (uvicorn)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from trtllm_gateway.engine.disagg import kv_stream
    from trtllm_gateway.engine.kv_region import HostArenas

    arenas = HostArenas()

    async def pull(request: Any) -> StreamingResponse:
        region = regions[request.path_params["rid"]]
        headers = {"Content-Length": str(kv_stream.stream_bytes(region))}
        body = kv_stream.frames(region, arenas.view(region))
        return StreamingResponse(body, media_type="application/octet-stream", headers=headers)

    app = Starlette(routes=[Route("/internal/v2/kv/{rid}", pull)])
    config = uvicorn.Config(app, port=port, log_level="warning", http="httptools", loop="uvloop")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server


def importer(conn: Connection, out: Connection, args: argparse.Namespace, port: int) -> None:
    """The decode side: copy each region into blocks reserved for it; report the times."""
    import msgspec as ms

    from trtllm_gateway.engine.disagg import kv_stream
    from trtllm_gateway.engine.disagg.kv_receive import KvReceiveArena
    from trtllm_gateway.engine.kv_region import KvRegion

    w, done = _worker(args.model_shape, args.tokens, args.decode_device, False, 1 << 20)
    receive = KvReceiveArena(_layout(args.model_shape), args.tokens)
    nixl: Any = None
    nixl_info: Any = None
    if "nixl" in args.transports:
        from trtllm_gateway.engine.disagg.kv_nixl import NixlEnd

        nixl = NixlEnd("decode")
    blocks = args.tokens // BS + 1
    results: dict[str, list[float]] = {}
    parts: dict[str, list[tuple[float, float]]] = {}  # (prefill side, decode side) seconds
    for transport in args.transports:
        for i in range(args.reps + 1):
            conn.send((transport, f"{transport}-{i}"))
            raw, t_stage = conn.recv()
            region = ms.json.decode(raw, type=KvRegion)
            t0 = time.perf_counter()
            if transport == "http":  # as an API server: into its receive arena, then the core
                url = f"http://127.0.0.1:{port}/internal/v2/kv/{transport}-{i}"
                region = _pull(kv_stream, receive, url, f"r{i}")
            elif transport == "nixl":  # one READ into the receive arena (kv_nixl.py), the core
                if not i:
                    nixl_info = conn.recv()
                    t0 = time.perf_counter()
                region = asyncio.run(_read_nixl(nixl, receive, region, f"r{i}", nixl_info))
            w.load(f"r{i}", region, None, list(range(blocks)))
            loaded = _wait(w, done)
            receive.free(f"r{i}")
            assert not loaded.error, loaded.error
            if i:  # the first is a warm-up (arena pages, IPC open, connection)
                decode_side = time.perf_counter() - t0
                results.setdefault(transport, []).append(t_stage + decode_side)
                parts.setdefault(transport, []).append((t_stage, decode_side))
            conn.send("copied")
    conn.send(None)
    exp_handoff = conn.recv()
    receive.close()
    imp_handoff = statistics.median(w.handoff_s) if w.handoff_s else 0.0
    out.send((results, parts, exp_handoff, imp_handoff))
    w.close()


async def _read_nixl(nixl: Any, receive: Any, region: Any, rid: str, info: bytes) -> Any:
    """remote_prefill's NIXL path: kv_nixl.pull reads the region into the receive arena."""
    from trtllm_gateway.engine.disagg import kv_nixl

    async def fetch(arena: str) -> bytes:
        return info

    got = await kv_nixl.pull(nixl, "exporter", region, receive, rid, fetch, 120.0)
    assert got is not None, "the receive arena has no room"
    return got


def _pull(kv_stream: Any, receive: Any, url: str, rid: str) -> Any:
    """remote_prefill's HTTP path: KvPull reads the stream into the receive arena."""
    placed: list[Any] = []

    def place(region: Any) -> memoryview:
        spot = receive.place(rid, region)
        assert spot is not None, "the receive arena has no room"
        placed.append(spot[1])
        return spot[0]

    kv_stream.KvPull(url, {}, None, 120.0).run(lambda r: None, place)
    return placed[0]


def raw_bandwidths(nbytes: int, args: argparse.Namespace) -> dict[str, float]:
    out = {"shm_memcpy": _shm_memcpy(nbytes), "loopback_tcp": _loopback_tcp(nbytes)}
    if args.prefill_device.startswith("cuda"):
        src = torch.device(args.prefill_device)
        dst = torch.device(args.decode_device)
        out["peer_copy"] = _timed_copy(nbytes, src, dst)
        out["pinned_d2h"] = _timed_copy(nbytes, src, torch.device("cpu"))
        out["pinned_h2d"] = _timed_copy(nbytes, torch.device("cpu"), dst)
    return out


def _best(fn: Any, nbytes: int, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def _shm_memcpy(nbytes: int) -> float:
    shm = SharedMemory(create=True, size=nbytes)
    try:
        assert shm.buf is not None
        dst = np.frombuffer(shm.buf, dtype=np.uint8)
        src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        np.copyto(dst, src)  # the pages exist before timing, as an arena's do
        bw = _best(lambda: np.copyto(dst, src), nbytes)
        dst = np.empty(0, dtype=np.uint8)  # the segment's view gone, it can close
        return bw
    finally:
        shm.close()
        shm.unlink()


def _loopback_tcp(nbytes: int) -> float:
    payload = memoryview(os.urandom(1 << 20) * (nbytes >> 20 or 1))
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def send() -> None:
        for _ in range(6):
            conn, _ = srv.accept()
            with conn:
                conn.sendall(payload)

    threading.Thread(target=send, daemon=True).start()
    buf = bytearray(len(payload))

    def recv() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            view, got = memoryview(buf), 0
            while got < len(buf):
                got += s.recv_into(view[got:], min(1 << 20, len(buf) - got))

    recv()  # warm-up
    return _best(recv, len(payload))


def _timed_copy(nbytes: int, src: torch.device, dst: torch.device) -> float:
    pin = src.type == "cpu" or dst.type == "cpu"
    a = torch.empty(nbytes, dtype=torch.uint8, device=src, pin_memory=pin and src.type == "cpu")
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst, pin_memory=pin and dst.type == "cpu")

    def copy() -> None:
        b.copy_(a, non_blocking=True)
        torch.cuda.synchronize(src if src.type == "cuda" else dst)
        torch.cuda.synchronize(dst if dst.type == "cuda" else src)

    copy()
    return _best(copy, nbytes, reps=10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-shape", choices=sorted(SHAPES), default="135m")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prefill-device", default="cpu")
    p.add_argument("--decode-device", default="cpu")
    p.add_argument("--arena-mb", type=int, default=0, help="0: twice the prompt's KV")
    p.add_argument("--transports", nargs="*", default=None)
    args = p.parse_args()
    layers, heads, dim, dtype = SHAPES[args.model_shape]
    nbytes = layers * 2 * args.tokens * heads * dim * dtype.itemsize
    args.arena_mb = args.arena_mb or 2 * (nbytes >> 20) + 2
    gpus = args.prefill_device.startswith("cuda") and args.decode_device.startswith("cuda")
    if args.transports is None:
        args.transports = ["cuda_ipc", "cuda_ipc_arena", "shm", "http"] if gpus else ["shm", "http"]
    raw = raw_bandwidths(nbytes, args)
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    mine, theirs = ctx.Pipe()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exp = ctx.Process(target=exporter, args=(a, args, port))
    imp = ctx.Process(target=importer, args=(b, theirs, args, port))
    exp.start()
    imp.start()
    results, parts, exp_handoff, imp_handoff = mine.recv()
    imp.join()
    exp.join()
    report = {
        "model_shape": args.model_shape,
        "tokens": args.tokens,
        "kv_MiB": round(nbytes / 2**20, 1),
        "devices": [args.prefill_device, args.decode_device],
        "raw_GBps": {k: round(v / 1e9, 2) for k, v in raw.items()},
        "stage_ms": {t: round(1e3 * statistics.median(v), 2) for t, v in results.items()},
        "stage_GBps": {
            t: round(nbytes / statistics.median(v) / 1e9, 2) for t, v in results.items()
        },
        "stage_parts_ms": {  # the prefill side's share (to the region sent), the decode side's
            t: [round(1e3 * statistics.median(p[k] for p in v), 3) for k in (0, 1)]
            for t, v in parts.items()
        },
        "step_thread_us_per_handoff": {
            "prefill_stage": round(1e6 * exp_handoff, 1),
            "decode_load": round(1e6 * imp_handoff, 1),
        },
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }
    for t, v in results.items():
        took = statistics.median(v)
        print(f"{t:9s} {1e3 * took:9.2f} ms  {nbytes / took / 1e9:7.2f} GB/s")
    for k, bw in raw.items():
        print(f"raw {k:14s} {bw / 1e9:7.2f} GB/s")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
