"""Where a decode step's time goes on CUDA: graph replay per batch size, kernel table, GEMV and
attention bandwidth, each next to the bytes it must move (device-to-device copy as the ceiling).

  python -m bench.profile_decode --model config/models/llama-3.1-8b.json --ctx 1088
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F

from bench.device import copy_bandwidth
from config.settings import Settings
from engine.builtin.kernels.decode_attention import choose_splits, decode_attention
from engine.builtin.loader import load


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="config/models/llama-3.1-8b.json")
    p.add_argument("--ctx", type=int, default=1088)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--profile-batch", type=int, default=1)
    args = p.parse_args()
    settings = Settings(
        model=args.model,
        load_format="dummy",
        max_model_len=2304,
        max_batch_size=max(args.batches),
        max_num_tokens=8192,
        kv_cache_fraction=0.5,
    )
    lm = load(settings)
    kp = lm.runner.kernels
    assert kp is not None and kp.graphs is not None
    g = kp.graphs
    cfg, page = lm.cfg, lm.blocks.block_size
    for k, v in lm.runner.kv_caches:
        k.normal_()
        v.normal_()
    bw = copy_bandwidth(torch.device("cuda"))
    report: dict[str, Any] = {"copy_GBps": bw / 1e9, "steps": {}, "gemv": {}, "attention": {}}
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    weights -= lm.model.embed_tokens.weight.numel() * lm.model.embed_tokens.weight.element_size()
    kv_tok = cfg.kv_elems_per_token * lm.dtype.itemsize
    blocks_per = -(-args.ctx // page)
    for b in args.batches:
        perm = torch.randperm(lm.blocks.num_blocks, device="cuda")[: b * blocks_per]
        g.block_tables[:b, :blocks_per] = perm.view(b, blocks_per).int()
        g.ctx_lens[:b] = args.ctx
        g.positions[:b] = args.ctx - 1
        g.slots[:b] = perm.view(b, blocks_per)[:, -1].long() * page
        g.input_ids[:b] = torch.randint(100, 1000, (b,), device="cuda")
        bucket = g.bucket(b)
        assert bucket == b, (b, bucket)
        ms = timed(lambda b=b: g.replay(b))
        need = weights + b * args.ctx * kv_tok
        report["steps"][b] = {"ms": ms, "roofline_ms": need / bw * 1e3, "tok_s": b / ms * 1e3}
        print(json.dumps({"batch": b, **report["steps"][b]}), flush=True)
    # Per-projection GEMV (M = 1) against its weight bytes.
    layer = lm.model.layers[0]
    for name, lin in [
        ("qkv", layer.self_attn.qkv_proj),
        ("o", layer.self_attn.o_proj),
        ("gate_up", layer.mlp.gate_up_proj),
        ("down", layer.mlp.down_proj),
        ("lm_head", lm.model.lm_head),
    ]:
        w = lin.weight
        for m in (1, 8):
            x = torch.randn(m, w.shape[1], device="cuda", dtype=w.dtype)
            ms = timed(lambda x=x, w=w: F.linear(x, w))
            eff = w.numel() * w.element_size() / (ms / 1e3) / bw
            report["gemv"][f"{name}_m{m}"] = {"ms": ms, "of_copy_bw": eff}
    # Split-KV decode attention alone, one layer.
    kc, vc = lm.runner.kv_caches[0]
    for b in args.batches:
        q = torch.randn(b, cfg.num_heads, cfg.head_dim, device="cuda", dtype=lm.dtype)
        bt, ctx = g.block_tables[:b], g.ctx_lens[:b]
        splits = choose_splits(b, cfg.num_kv_heads, args.ctx, page, kp.sms)
        ms = timed(lambda q=q, bt=bt, ctx=ctx, s=splits: decode_attention(q, kc, vc, bt, ctx, 0.1, page, s))
        eff = b * args.ctx * kv_tok / cfg.num_layers / (ms / 1e3) / bw
        report["attention"][b] = {"ms": ms, "splits": splits, "of_copy_bw": eff}
    from torch.profiler import ProfilerActivity, profile

    pb = args.profile_batch
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            g.replay(pb)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=14)
    print(table)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
