"""no_collection: no garbage collection while CUDA graphs are captured.

torch's graph context no longer collects garbage before a capture (torch.cuda.graphs, since
`force_cudagraph_gc` defaults to off: "REALLY expensive"). Cyclic garbage that holds CUDA objects
(an engine built before in the same process: its Stepper and Scheduler form a cycle, so its
backend's graphs wait for the collector) may then be collected mid-capture, whenever a Python
allocation triggers the collector: the dead graphs' reset is "not permitted when stream is
capturing" and invalidates the capture (seen on an H200, 2026-11-29: tests/gpu/
test_graph_sampling.py's second engine failed its decode graphs' capture in 1 of 4 runs,
cudaErrorStreamCaptureInvalidated; with the collector off, it passed). So: collect first, then
keep the collector off until every graph of the set is captured (vLLM too collects before its
captures and keeps the collector from running during them).
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
