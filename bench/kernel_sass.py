"""Instructions in an attention kernel's main loop, compiled for a GPU on a machine without one.

Triton compiles for a named target without a driver, and its wheel carries ptxas and nvdisasm,
so the SASS of a kernel can be read on a CPU box: this prints the opcodes of the longest loop (a
backward branch) of the decode or prefill attention kernel, by kind, and the warp-instructions a
key that loop costs. What it showed (issue 39): the e4m3 decode kernel moved K out of shared
memory a byte at a time (LDS.U8), 34 instructions a key against 22.5 once the cache is read as
16-bit words; prefill's bf16 widening of e4m3 824 instructions a tile against 638 in fp16.

Needs Triton (`pip install triton==3.6.0`, the GPU machine's version; not a project
dependency):

  python -m bench.kernel_sass decode --kv fp8 --config 128,2,4          # the engine's words kernel
  python -m bench.kernel_sass decode --kv fp8 --config 64,2,5 --bytes   # the byte-typed kernel
  python -m bench.kernel_sass decode --kv bf16 --config 64,4,3
  python -m bench.kernel_sass prefill --kv fp8
  python -m bench.kernel_sass decode --kv fp8 --head-dim 64 --group 3 --kv-heads 3 --config 64,4,3
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from trtllm_gateway.engine.builtin.kernels import decode_attention as da
from trtllm_gateway.engine.builtin.kernels import decode_attention_e4m3 as words
from trtllm_gateway.engine.builtin.kernels import decode_attention_heads as all_heads
from trtllm_gateway.engine.builtin.kernels import prefill_attention as pa

KV = {"fp8": "fp8e4nv", "bf16": "bf16", "fp16": "fp16"}
INTS = ("lens_ptr", "bt_ptr", "qstart_ptr", "qlen_ptr", "tiles_ptr")
# Runtime ints Triton does not specialize (do_not_specialize): no divisibility hint.
UNHINTED = {"stride_btb", "num_splits"}


def compile_kernel(fn: Any, kv: str, consts: dict[str, Any], warps: int, stages: int, arch: int):  # type: ignore[no-untyped-def]
    """As a launch compiles it: pointers and strides carry the divisibility-by-16 hint Triton
    gives an argument that is a multiple of 16 (the caches' strides are)."""
    names = fn.arg_names
    sig: dict[str, str] = {}
    for n in names:
        if n in consts:
            sig[n] = "constexpr"
        elif n in ("k_ptr", "v_ptr"):
            sig[n] = f"*{KV[kv]}"
        elif n in INTS:
            sig[n] = "*i32"
        elif n in ("mid_o_ptr", "mid_lse_ptr"):
            sig[n] = "*fp32"
        elif n.endswith("_ptr"):
            sig[n] = "*bf16"
        elif n in ("scale", "v_scale"):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    hinted = [
        i
        for i, n in enumerate(names)
        if sig[n].startswith("*") or (sig[n] == "i32" and n not in UNHINTED)
    ]
    src = ASTSource(
        fn,
        sig,
        constexprs={(names.index(k),): v for k, v in consts.items() if k in names},
        attrs={(i,): [["tt.divisibility", 16]] for i in hinted},
    )
    return triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps, "num_stages": stages}
    )


def loop_opcodes(sass: str) -> collections.Counter[str]:
    """Opcodes between the longest backward branch and its label."""
    lines = sass.splitlines()
    labels = {
        ln.strip().rstrip(":"): i for i, ln in enumerate(lines) if re.match(r"^\s*\.L_x_\d+:", ln)
    }
    best = (0, -1)
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", ln)
        if m and labels.get(m.group(1), i) < i and i - labels[m.group(1)] > best[1] - best[0]:
            best = (labels[m.group(1)], i)
    ops: collections.Counter[str] = collections.Counter()
    for ln in lines[best[0] : best[1] + 1]:
        m = re.search(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", ln)
        if m:
            ops[m.group(1)] += 1
    return ops


def disassemble(kernel: Any) -> str:
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run(
            [str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True
        ).stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("kernel", choices=["decode", "prefill"])
    p.add_argument("--kv", default="fp8", choices=list(KV))
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--group", type=int, default=4, help="query heads a KV head")
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--config", default="", help="tokens a tile, warps, stages (decode)")
    p.add_argument("--bytes", action="store_true", help="decode: the byte-typed e4m3 kernel")
    p.add_argument("--arch", type=int, default=90)
    p.add_argument(
        "--kv-heads",
        type=int,
        default=0,
        help="decode over e4m3: decode_attention_heads' kernel, all these KV heads a program",
    )
    p.add_argument("--pad", action="store_true", help="--kv-heads: one padded piece a row")
    args = p.parse_args()
    dim = args.head_dim
    e4m3 = args.kv == "fp8"
    shape = {"GROUP": args.group, "HEAD_DIM": dim, "D_PAD": dim, "PAGE": args.page}
    if args.kernel == "prefill":
        fn, block_n, warps, stages = pa._prefill_kernel, 64, 4, 2
        consts = {**shape, "BLOCK_M": pa.BLOCK_M, "BLOCK_N": 64, "IEEE": False, "F16": e4m3}
    else:
        cfg = args.config or ",".join(map(str, da.E4M3_WORDS_CONFIG if e4m3 else (64, 4, 3)))
        block_n, warps, stages = (int(x) for x in cfg.split(","))
        shape |= {"SPLIT": False, "GROUP_PAD": max(16, triton.next_power_of_2(args.group))}
        if args.kv_heads:
            hq = args.kv_heads * args.group
            rows, cols_a, cols_b = all_heads.layout(hq, args.kv_heads, dim, args.pad) or (0, 0, 0)
            fn = all_heads._decode_heads_kernel
            consts = {
                **shape,
                "NUM_HEADS": hq,
                "ROWS": rows,
                "COLS_A": cols_a,
                "COLS_B": cols_b,
                "ROW_WORDS": args.kv_heads * dim // 2,
                "BLOCK_N": block_n,
            }
        elif e4m3 and not args.bytes:
            fn, consts = words._decode_e4m3_kernel, {**shape, "BLOCK_N": block_n}
        else:
            fn = da._decode_split_kernel
            consts = {**shape, "BLOCK_N": block_n, "IEEE": False, "F16": e4m3, "PAGED_BT": e4m3}
    kernel = compile_kernel(fn, args.kv, consts, warps, stages, args.arch)
    ops = loop_opcodes(disassemble(kernel))
    total = sum(ops.values())
    print(f"{fn.__name__} sm_{args.arch} kv={args.kv} tile={block_n} warps={warps} stages={stages}")
    print(
        f"main loop: {total} instructions a warp, {total * warps / block_n:.1f} a key (all warps)"
    )
    print("  " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))


if __name__ == "__main__":
    main()
