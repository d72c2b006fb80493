"""Where a decode step's time goes on CUDA: graph replay per batch size, kernel table, GEMV and
attention bandwidth, each next to the bytes it must move (device-to-device copy as the ceiling).

  python -m bench.profile_decode --model trtllm_gateway/config/models/llama-3.1-8b.json --ctx 1088
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F

from bench.device import copy_bandwidth
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin.kernels.decode_attention import choose_splits, decode_attention
from trtllm_gateway.engine.builtin.loader import load
from trtllm_gateway.engine.builtin.triton_backend import TritonBackend


def timed(fn: Any, iters: int = 30) -> float:
    """Median milliseconds of fn() by CUDA events."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def graphed(fn: Any, reps: int = 20) -> float:
    """Milliseconds per call of fn() replayed back to back from one CUDA graph (no launch gaps)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return timed(g.replay, 10) / reps


def sweep_gemv(lm: Any, bw: float) -> dict[str, Any]:
    from trtllm_gateway.engine.builtin.kernels.skinny_gemm import skinny_linear

    layer = lm.model.layers[0]
    out: dict[str, Any] = {}
    for name, lin in [
        ("qkv", layer.self_attn.qkv_proj),
        ("o", layer.self_attn.o_proj),
        ("gate_up", layer.mlp.gate_up_proj),
        ("down", layer.mlp.down_proj),
    ]:
        w = lin.weight
        x = torch.randn(1, w.shape[1], device="cuda", dtype=w.dtype)
        nbytes = w.numel() * w.element_size()
        row: dict[str, float] = {
            "cublas": nbytes / (graphed(lambda x=x, w=w: F.linear(x, w)) / 1e3) / bw
        }
        for bn, bk, st in [
            (16, 256, 4),
            (16, 512, 3),
            (32, 256, 4),
            (32, 128, 6),
            (64, 128, 4),
            (8, 512, 4),
        ]:
            if bn < 16:
                continue
            ms = graphed(
                lambda x=x, w=w, c=(bn, bk, st): skinny_linear(
                    x, w, block_n=c[0], block_k=c[1], num_stages=c[2]
                )
            )
            row[f"{bn}x{bk}s{st}"] = nbytes / (ms / 1e3) / bw
        out[name] = row
        print(json.dumps({name: row}), flush=True)
    return out


def sweep_attention(lm: Any, g: Any, kp: Any, bw: float, ctx: int) -> dict[str, Any]:
    cfg, page = lm.cfg, lm.blocks.block_size
    kc, vc = lm.backend.kv_caches[0]
    kv_tok = cfg.kv_elems_per_token * lm.dtype.itemsize // cfg.num_layers
    out: dict[str, Any] = {}
    for b in (1, 64, 256):
        q = torch.randn(b, cfg.num_heads, cfg.head_dim, device="cuda", dtype=lm.dtype)
        bt, lens = g.block_tables[:b], g.ctx_lens[:b]
        splits = choose_splits(b, cfg.num_kv_heads, ctx, page, kp.sms)
        row: dict[str, float] = {}
        for conf in [
            (64, 4, 2),
            (32, 4, 2),
            (64, 4, 3),
            (64, 8, 2),
            (128, 8, 2),
            (128, 4, 3),
            (32, 4, 4),
            (64, 8, 3),
        ]:
            try:
                ms = graphed(
                    lambda q=q, bt=bt, lens=lens, s=splits, c=conf: decode_attention(
                        q, kc, vc, bt, lens, 0.1, page, s, config=c
                    )
                )
            except Exception as e:  # a config that does not fit
                row[str(conf)] = float("nan")
                print("attention config failed", conf, repr(e)[:200])
                continue
            row[str(conf)] = b * ctx * kv_tok / (ms / 1e3) / bw
        out[b] = row
        print(json.dumps({"attention_batch": b, "splits": splits, "of_copy_bw": row}), flush=True)
    return out


def fill_batch(g: Any, lm: Any, b: int, ctx: int) -> None:
    page = lm.blocks.block_size
    blocks_per = -(-ctx // page)
    perm = torch.randperm(lm.blocks.num_blocks, device="cuda")[: b * blocks_per]
    n, p = g.max_batch_size, g.packed  # cuda_graph.py's layout: ids, positions, slots, lengths
    g.block_tables[:b, :blocks_per] = perm.view(b, blocks_per).int()
    p[3 * n : 3 * n + b] = ctx
    p[n : n + b] = ctx - 1
    p[2 * n : 2 * n + b] = (perm.view(b, blocks_per)[:, -1] * page).int()
    p[:b] = torch.randint(100, 1000, (b,), device="cuda", dtype=torch.int32)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="trtllm_gateway/config/models/llama-3.1-8b.json")
    p.add_argument("--ctx", type=int, default=1088)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--profile-batch", type=int, default=1)
    p.add_argument("--sweeps", action="store_true", help="attention and GEMV config sweeps")
    p.add_argument("--quantization", default="none", choices=["none", "fp8"])
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    args = p.parse_args()
    config = EngineConfig(
        model=args.model,
        load_format="dummy",
        max_model_len=2304,
        max_batch_size=max(args.batches),
        max_num_tokens=8192,
        kv_cache_fraction=0.5,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    lm = load(config)
    kp = lm.backend
    assert isinstance(kp, TritonBackend) and kp.graphs is not None
    g = kp.graphs
    cfg = lm.cfg
    for k, v in lm.backend.kv_caches:
        if k.element_size() == 1:  # e4m3: small positive bytes (0x7f would be NaN)
            k.view(torch.uint8).random_(0, 0x60)
            v.view(torch.uint8).random_(0, 0x60)
        else:
            k.normal_()
            v.normal_()
    bw = copy_bandwidth(torch.device("cuda"))
    report: dict[str, Any] = {"copy_GBps": bw / 1e9, "steps": {}}
    tensors = [*lm.model.parameters()]  # and FP8 layers' e4m3 weights and scales
    tensors += [b for n, b in lm.model.named_buffers() if n.endswith(("weight", "weight_scale"))]
    weights = sum(p.numel() * p.element_size() for p in tensors)
    weights -= lm.model.embed_tokens.weight.numel() * lm.model.embed_tokens.weight.element_size()
    kv_tok = cfg.kv_elems_per_token * lm.backend.kv_caches[0][0].element_size()
    assert lm.model.ops is not None
    for skinny in (True, False):
        lm.model.ops.skinny = skinny
        g.capture()
        for b in args.batches:
            fill_batch(g, lm, b, args.ctx)
            ms = timed(lambda b=b: g.replay(b))
            need = weights + b * args.ctx * kv_tok
            row = {"ms": ms, "roofline_ms": need / bw * 1e3, "tok_s": b / ms * 1e3}
            report["steps"][f"{b}{'_skinny' if skinny else ''}"] = row
            print(json.dumps({"batch": b, "skinny": skinny, **row}), flush=True)
    lm.model.ops.skinny = True
    g.capture()
    from torch.profiler import ProfilerActivity, profile

    fill_batch(g, lm, args.profile_batch, args.ctx)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            g.replay(args.profile_batch)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12))
    if args.sweeps:
        fill_batch(g, lm, 256, 1536)
        report["attention"] = sweep_attention(lm, g, kp, bw, 1536)
        report["gemv"] = sweep_gemv(lm, bw)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
