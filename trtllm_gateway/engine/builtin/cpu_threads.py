"""One thread for small CPU kernel calls: a decode step's calls are too short to pay a fork/join.

A batch-1 decode step makes about 150 compiled-kernel calls of 0.05-0.3 ms each (30 layers of four
projections and attention). Each parallel call ends on a barrier that waits for every OpenMP
thread, and on a CPU that other processes share, a thread that was preempted makes that barrier
wait for the scheduler (milliseconds): measured on the 2-core EPYC at load 6, served output at
concurrency 1 was 1.5 tok/s with torch's 2 threads against 16.2 tok/s with OMP_NUM_THREADS=1
(docs/benchmarks.md, "AVX2-only CPUs"). Calls below MIN_PARALLEL_FMAS multiply-adds (about
1 ms on one AVX2 core) therefore run on the calling thread; larger ones (the LM head, steps of
many rows, prefill) keep torch's threads, where the work amortizes a barrier.

When the process's threads do get their cores (run_queue.py: they wait for a CPU less than
FREE_BELOW of a core), waking a passive thread costs microseconds, and every call runs on both
threads (MIN_PARALLEL_FMAS_FREE = 0): measured on the 2-core Xeon with the AVX2 kernels, a
batch-8 decode step took 54 ms instead of 74 with the machine idle, and even a batch-1 step's
120 projection calls (0.3-1.8M multiply-adds each) took 5.0 ms on two threads against 9.3 on one
(int8; float32 10.6 against 16.6; docs/benchmarks.md). Above CONTENDED_ABOVE the conservative
threshold is back.
The kernels split their work by output columns or by (row, KV head), so the number of threads
never changes a result's bits, only its time.

How a thread waits between calls is libgomp's default (OMP_WAIT_POLICY unset, issue 36): it
spins GOMP_SPINCOUNT = 300000 times, then sleeps, so the threads stay hot through a
step's calls and sleep once the engine idles. The package once set PASSIVE (sleep at once; a
futex wake per parallel call): on an idle 2-core Xeon the gateway's inter-token p50 at
concurrency 1 was 25-27 ms passive and 14 ms with ACTIVE (issue 36). ACTIVE spins ~30 s, which a
shared CPU cannot afford: batch-1 steps with every call on both threads under load 14 on the
2-core EPYC took 5764 ms a step with ACTIVE, 143 PASSIVE, 88-102 with the default (interleaved,
bench/cpu_wait.py); the CPU used in the second after the steps was under 10 ms with the default
and PASSIVE, 80 ms with ACTIVE. An operator's OMP_WAIT_POLICY or GOMP_SPINCOUNT still applies.
Served at concurrency 1 under load 5 (main against this, raced): inter-token p50 lower in every
pair (25.5 / 50.2 ms against 27.0 / 70.0), TTFT p50 worse in two of three (prefill's dense GEMMs
run on both threads, and a spinning thread holds the core its preempted partner needs): on a
shared CPU, PASSIVE in the server's environment is the safer choice (docs/benchmarks.md,
"Issue 36").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import torch

from trtllm_gateway.engine.builtin.run_queue import RunQueueWait

logger = logging.getLogger(__name__)

MIN_PARALLEL_FMAS = 8_000_000  # while other work contends for the cores (and until measured)
MIN_PARALLEL_FMAS_FREE = 0  # while this process's threads get theirs: every call
# The run-queue wait share (CPU-seconds waited a second, summed over the process's threads) that
# means contended, and the one that means free; between the two the previous state holds. Other
# test suites and kernel builds on the 2-core VM measured 0.32-0.75 while stepping, an idle
# machine 0.0; the API server and a load generator beside the engine take a few percent of a
# core, which should not count as contention.
CONTENDED_ABOVE = 0.3
FREE_BELOW = 0.15

P = ParamSpec("P")
R = TypeVar("R")


class ThreadPolicy:
    """The multiply-adds from which a call gets torch's threads, from the measured contention."""

    def __init__(self, wait: RunQueueWait | None = None) -> None:
        self._wait = wait or RunQueueWait()
        self.contended = True  # conservative until a sample says otherwise

    def min_parallel_fmas(self) -> int:
        share = self._wait.share()
        if share is not None:
            contended = share > CONTENDED_ABOVE or (self.contended and share >= FREE_BELOW)
            if contended != self.contended:
                state = "contended" if contended else "free"
                logger.debug("CPU threads %s (run-queue wait share %.2f)", state, share)
            self.contended = contended
        return MIN_PARALLEL_FMAS if self.contended else MIN_PARALLEL_FMAS_FREE


POLICY = ThreadPolicy()  # one per process, as the OpenMP pool it sizes calls for


@contextmanager
def threads_for(fmas: int, policy: ThreadPolicy | None = None) -> Iterator[None]:
    """torch's threads for a call of `fmas` multiply-adds, or just this one if it is small
    (by `policy`, default the process's POLICY)."""
    n = torch.get_num_threads()
    if n == 1 or fmas >= (policy or POLICY).min_parallel_fmas():
        yield
        return
    torch.set_num_threads(1)  # about 0.5 us; the OpenMP pool stays
    try:
        yield
    finally:
        torch.set_num_threads(n)


def call_sized(fmas: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """fn(*args, **kwargs) as under threads_for(fmas), by the process's POLICY, without a context
    manager: the form a decode step's ~150 kernel calls take (a generator-based `with` is four
    Python calls more each; issue 36, docs/benchmarks.md)."""
    n = torch.get_num_threads()
    if n == 1 or fmas >= POLICY.min_parallel_fmas():
        return fn(*args, **kwargs)
    torch.set_num_threads(1)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_num_threads(n)


def sized(fn: Callable[P, R], fmas: Callable[P, int]) -> Callable[P, R]:
    """fn, called under threads_for(fmas(*args))."""

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return call_sized(fmas(*args, **kwargs), fn, *args, **kwargs)

    return call
