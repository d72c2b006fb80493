"""no_collection: no garbage collection while CUDA graphs are captured.

torch's graph context no longer collects garbage before a capture (torch/cuda/graphs.py: only
with `torch.compiler.config.force_cudagraph_gc`, off by default, as "REALLY expensive"), so the
collector may run mid-capture, whenever a Python allocation triggers it, and finalize whatever
cyclic garbage holds (an engine built before in the same process: its Stepper and Scheduler form
a cycle, so its backend waits for the collector). On an H200 (2026-11-29), tests/gpu/
test_graph_sampling.py's second engine failed its decode graphs' capture with
cudaErrorStreamCaptureInvalidated in 5 of 6 runs with the collector on (three code variants; the
session's base code passed its one run),
and passed in 4 of 4 with it off (once by gc.disable(), three times with this guard). Which
finalizer invalidates the capture was not found: a dead cycle holding a captured graph, pinned
buffers read by pending copies and their events, collected mid-capture, did not invalidate
one. So: collect first, then keep the collector off until the set of graphs is captured (vLLM
too collects before its captures and keeps the collector from running during them).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_collection() -> Iterator[None]:
    """Collect now, then no automatic collection inside (restored on exit)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
