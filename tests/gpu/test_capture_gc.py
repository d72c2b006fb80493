"""A graph captured beside a dead engine's graphs (capture_gc.no_collection): cyclic garbage
holding a captured CUDAGraph, and the collector forced to run at nearly every allocation. A
collection inside the capture would destroy that graph there (its reset is "not permitted when
stream is capturing") and invalidate the capture (cudaErrorStreamCaptureInvalidated: seen in
tests/gpu/test_graph_sampling.py on an H200, 2026-11-29). Run with the wrapper off, the same
capture fails (bench/gpu_call.sh's call of 2026-11-29, reported in docs/benchmarks.md).

    python -m pytest tests/gpu/test_capture_gc.py -m gpu -q
"""

from __future__ import annotations

import gc
import os

import torch

from trtllm_gateway.engine.builtin.capture_gc import no_collection


def _dead_graph() -> None:
    x = torch.zeros(1024, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
    holder: list[object] = [g, x]
    holder.append(holder)  # a cycle: only the collector frees the graph


def test_a_capture_beside_dead_graphs_is_not_invalidated() -> None:
    guard = os.environ.get("CAPTURE_GC_GUARD", "1") == "1"  # 0: show the failure it prevents
    old = gc.get_threshold()
    gc.collect()
    for _ in range(4):
        _dead_graph()
    y = torch.ones(4096, device="cuda")
    g = torch.cuda.CUDAGraph()
    try:
        gc.set_threshold(1)
        if guard:
            with no_collection(), torch.cuda.graph(g):
                for _ in range(50):
                    y.mul_(1.0)
                    _ = [[object()] for _ in range(20)]  # Python allocations mid-capture
        else:
            with torch.cuda.graph(g):
                for _ in range(50):
                    y.mul_(1.0)
                    _ = [[object()] for _ in range(20)]
    finally:
        gc.set_threshold(*old)
    g.replay()
    torch.cuda.synchronize()
    assert bool((y == 1).all())
