"""The batch-1 decode chain of the 8B shape, kernel for kernel, in variants: programmatic dependent
launch (kernels/pdl.py) off, on for every kernel of the chain, and on with RoPE + KV store and
decode attention (with its merge) each launched early or plainly (their `early`; the FP8
kernels' own edges, the RMSNorms, SiLU-mul, the row quantization and the GEMMs, stay early).
The engine launches RoPE + KV store and attention plainly: with FP8 weights they gained nothing
here; with bf16 they gained here, but the engine's batch-1 step lost 0.8% (all three early) and
0.5% (RoPE alone) on an H200 (2026-11-29): this chain does not predict the bf16 engine.

Each layer runs what the engine's fused path runs at batch 1 (model.py _forward_fused): the
RMSNorm (quantizing for FP8), the qkv projection, RoPE + KV store, decode attention over a
1,152-token paged cache, o_proj into the residual, the RMSNorm, gate_up, SiLU-mul, down into the
residual; bf16 projects qkv and gate_up with cuBLAS, as the engine does. Random weights, one
CUDA graph of all layers, the median replay. bf16's early variants launch its RMSNorm early too
(its skinny GEMMs never: measured slower on 2026-11-29).

  python -m bench.decode_chain [--layers 32] [--dtype fp8 bf16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.device import copy_bandwidth
from bench.profile_decode import graphed
from trtllm_gateway.engine.builtin import fp8
from trtllm_gateway.engine.builtin.kernels import pdl
from trtllm_gateway.engine.builtin.kernels.decode_attention import choose_splits, decode_attention
from trtllm_gateway.engine.builtin.kernels.fp8_quant import QuantRows
from trtllm_gateway.engine.builtin.kernels.fused_ops import (
    rms_norm,
    rms_norm_fp8,
    silu_mul,
    silu_mul_fp8,
)
from trtllm_gateway.engine.builtin.kernels.rope_store import rope_and_store
from trtllm_gateway.engine.builtin.kernels.skinny_gemm import skinny_fp8, skinny_linear
from trtllm_gateway.engine.builtin.model_config import ModelConfig
from trtllm_gateway.engine.builtin.rope import RotaryEmbedding

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, PAGE, CTX = 4096, 14336, 32, 8, 128, 16, 1152
CUDA = torch.device("cuda")
SHAPE = Path("trtllm_gateway/config/models/llama-3.1-8b.json")
# (name, GATEWAY_PDL, (RoPE + KV store, attention) launched early where PDL is on)
VARIANTS = [
    ("off", "0", (True, True)),
    ("on, RoPE and attention early", "1", (True, True)),
    ("on, RoPE early, attention plain", "1", (True, False)),
    ("on, RoPE plain, attention early", "1", (False, True)),
    ("on, RoPE and attention plain (the engine)", "1", (False, False)),
]
SHARED = (True, True)  # the variant's third field


def weight(n: int, k: int, dtype: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = (torch.randn(n, k, device=CUDA) * 0.02).to(torch.bfloat16)
    if dtype == "fp8":
        return fp8.quantize_weight(w)
    return w, None


def layer_fn(dtype: str) -> tuple[Callable[[], None], int]:
    """One layer's kernels on fresh weights, and the weight bytes it reads."""
    qkv, s_qkv = weight((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, dtype)
    o, s_o = weight(HIDDEN, HEADS * HEAD_DIM, dtype)
    gu, s_gu = weight(2 * INTER, HIDDEN, dtype)
    down, s_down = weight(HIDDEN, INTER, dtype)
    kv_dtype = fp8.FP8 if dtype == "fp8" else torch.bfloat16
    blocks = -(-CTX // PAGE)
    kc = torch.randn(blocks * PAGE, KV_HEADS, HEAD_DIM, device=CUDA).to(kv_dtype)
    vc = torch.randn(blocks * PAGE, KV_HEADS, HEAD_DIM, device=CUDA).to(kv_dtype)
    bt = torch.arange(blocks, dtype=torch.int32, device=CUDA).view(1, -1)
    lens = torch.tensor([CTX], dtype=torch.int32, device=CUDA)
    sms = torch.cuda.get_device_properties(CUDA).multi_processor_count
    splits = choose_splits(1, KV_HEADS, CTX, PAGE, sms)
    ln = torch.ones(HIDDEN, device=CUDA, dtype=torch.bfloat16)
    residual = torch.randn(1, HIDDEN, device=CUDA).to(torch.bfloat16)
    nbytes = sum(t.numel() * t.element_size() for t in (qkv, o, gu, down))

    rope = RotaryEmbedding(ModelConfig.from_file(SHAPE), 4096).to(CUDA)
    pos = torch.tensor([CTX - 1], device=CUDA)
    slot = torch.tensor([CTX - 1], device=CUDA)
    shape = (HEADS, KV_HEADS, HEAD_DIM)

    def run() -> None:
        rope_early, attn_early = (pdl.enabled(CUDA) and e for e in SHARED)
        early = rope_early or attn_early  # bf16's RMSNorm
        if dtype == "fp8":
            assert s_qkv is not None and s_o is not None and s_gu is not None
            assert s_down is not None
            x = QuantRows(*rms_norm_fp8(residual, ln, 1e-5))
            h = skinny_fp8(x, qkv, s_qkv, out_dtype=torch.bfloat16)
        else:
            h = F.linear(rms_norm(residual, ln, 1e-5, early=early), qkv)
        q = rope_and_store(h, pos, rope.cos, rope.sin, kc, vc, slot, *shape, early=rope_early)
        a = decode_attention(q, kc, vc, bt, lens, HEAD_DIM**-0.5, PAGE, splits, early=attn_early)
        a2 = a.view(1, HEADS * HEAD_DIM)
        if dtype == "fp8":
            assert s_o is not None and s_gu is not None and s_down is not None
            skinny_fp8(a2, o, s_o, residual, out_dtype=torch.bfloat16)
            x = QuantRows(*rms_norm_fp8(residual, ln, 1e-5))
            g = skinny_fp8(x, gu, s_gu, out_dtype=torch.bfloat16)
            skinny_fp8(QuantRows(*silu_mul_fp8(g)), down, s_down, residual, torch.bfloat16)
        else:
            skinny_linear(a2, o, residual)
            g = F.linear(rms_norm(residual, ln, 1e-5, early=early), gu)
            skinny_linear(silu_mul(g), down, residual)

    return run, nbytes


def chain(fns: list[Callable[[], None]]) -> None:
    for fn in fns:
        fn()


def main() -> None:
    global SHARED
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--dtype", nargs="+", default=["fp8"])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    bw = copy_bandwidth(CUDA)
    for dtype in args.dtype:
        layers = [layer_fn(dtype) for _ in range(args.layers)]
        nbytes = sum(b for _, b in layers)
        res: dict[str, list[float]] = {name: [] for name, *_ in VARIANTS}
        for _ in range(args.rounds):  # variants interleaved, each its own capture
            for name, env, shared in VARIANTS:
                os.environ[pdl.ENV] = env
                SHARED = shared
                res[name].append(graphed(lambda fns=[f for f, _ in layers]: chain(fns), 1))
        os.environ.pop(pdl.ENV, None)
        SHARED = (True, True)
        out: dict[str, Any] = {
            "dtype": dtype,
            "layers": args.layers,
            "weight_GB": round(nbytes / 1e9, 3),
            "copy_GBps": round(bw / 1e9, 1),
            "weights_at_copy_ms": round(nbytes / bw * 1e3, 4),
        }
        for name, ms in res.items():
            med = sorted(ms)[len(ms) // 2]
            out[name] = {"ms": round(med, 4), "all": [round(m, 4) for m in ms]}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
