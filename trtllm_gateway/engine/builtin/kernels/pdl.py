"""Programmatic dependent launch (Hopper and later) for the small-batch decode path (issue 39).

A batch-1 decode step is a chain of short kernels; each skinny GEMM reads its weight once, and on
an H200 a 16 MB weight takes ~4 us at copy bandwidth, about what a kernel boundary costs. With
PDL a kernel of the FP8 chain (the quantizing RMSNorm, the e4m3 projections, SiLU-mul, the row
quantization; RoPE + KV store, decode attention and plain RMSNorm where their caller asks, which
the engine does not) is launched while the kernel before it still runs: each waits (`gdc_wait`)
for everything the kernel before it wrote before it reads or writes anything, then signals
`gdc_launch_dependents`, so the next one's programs are resident before it ends (early_start).
Signalled after the wait, not before: a kernel that signals as it starts lets the next launch and
signal at once, and so on down the chain, until waiting programs of kernels far ahead hold the
SMs the running one needs (measured on an H200, bench/decode_chain.py, 2026-11-29: the 8B chain
3.15 ms a step that way, 2.98-2.99 with no early launch, 2.78-2.80 signalling after the wait).
The skinny GEMM prefetches the head of its weight into L2 before its wait: nothing in the chain
writes a weight. The wait makes a kernel exact whatever comes before it: one that never signals
simply lets it start when it completes, and since that kernel waited for its own predecessor,
the chain is ordered end to end.

`GATEWAY_PDL=0` turns it off (the A/B of bench.offline's batch-1 decode); it is off below
compute capability 9.0, where the griddepcontrol instructions do not exist.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ENV = "GATEWAY_PDL"
LINE_BYTES = 128  # an L2 prefetch fetches one 128-byte line
PREFETCH_BYTES = 4 << 20  # of a weight, prefetched while the kernel before runs

__all__ = [
    "ENV",
    "early_start",
    "enabled",
    "gdc_launch_dependents",
    "gdc_wait",
    "prefetch_l2",
    "prefetch_lines",
]


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(device: torch.device) -> bool:
    """Whether kernels on this device use PDL (CUDA, compute capability >= 9.0, not turned off)."""
    if device.type != "cuda" or os.environ.get(ENV, "1") == "0":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def prefetch_lines(rows: int, row_bytes: int) -> int:
    """Lines of each weight row to prefetch: a power of two, the whole prefetch at most
    PREFETCH_BYTES and no more than the row holds."""
    lines = min(PREFETCH_BYTES // max(1, rows), row_bytes) // LINE_BYTES
    return 0 if lines < 1 else 1 << (lines.bit_length() - 1)


@triton.jit
def prefetch_l2(ptrs) -> None:
    """Fetch the 128-byte line of every address in ptrs into L2 (no registers, no wait)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; // dummy $0",
        "=r,l",
        [ptrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def early_start(PDL: tl.constexpr) -> None:
    """The first statement of a kernel launched early (launch_pdl=PDL): wait for everything the
    kernel before it wrote, then let the kernel after it launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
