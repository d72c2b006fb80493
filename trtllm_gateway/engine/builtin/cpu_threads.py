"""One thread for small CPU kernel calls: a decode step's calls are too short to pay a fork/join.

A batch-1 decode step makes about 150 compiled-kernel calls of 0.05-0.3 ms each (30 layers of four
projections and attention). Each parallel call ends on a barrier that waits for every OpenMP
thread, and on a CPU that other processes share, a thread that was preempted makes that barrier
wait for the scheduler (milliseconds): measured on the 2-core EPYC at load 6, served output at
concurrency 1 was 1.5 tok/s with torch's 2 threads against 16.2 tok/s with OMP_NUM_THREADS=1
(docs/benchmarks.md, "AVX2-only CPUs"). Calls below MIN_PARALLEL_FMAS multiply-adds (about
1 ms on one AVX2 core) therefore run on the calling thread; larger ones (the LM head, steps of
many rows, prefill) keep torch's threads, where the work amortizes a barrier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import torch

MIN_PARALLEL_FMAS = 8_000_000

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def threads_for(fmas: int) -> Iterator[None]:
    """torch's threads for a call of `fmas` multiply-adds, or just this one if it is small."""
    n = torch.get_num_threads()
    if fmas >= MIN_PARALLEL_FMAS or n == 1:
        yield
        return
    torch.set_num_threads(1)  # about 0.5 us; the OpenMP pool stays
    try:
        yield
    finally:
        torch.set_num_threads(n)


def sized(fn: Callable[P, R], fmas: Callable[P, int]) -> Callable[P, R]:
    """fn, called under threads_for(fmas(*args))."""

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with threads_for(fmas(*args, **kwargs)):
            return fn(*args, **kwargs)

    return call
