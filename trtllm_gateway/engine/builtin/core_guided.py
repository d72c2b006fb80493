"""GuidedWorker: the engine core's grammar builds, off its step loop, each with a deadline.

A constraint's matcher (llguidance: grammar, lexer, first mask) takes ~1 ms for an ordinary
schema and seconds for a few hostile bytes (`a{1000000}`, issue 24). Built in the step loop,
that stalled every stream; here it runs on a small thread pool (llguidance drops the GIL while
it builds), the request waits outside the scheduler, and the core admits it once a Wakeup
says its matcher is ready. A build still running at its deadline fails its request with a 400
(its late result is dropped); the thread cannot be interrupted, but llguidance's own fuel
limits end it. The build threads run at the lowest CPU priority: on a small CPU box the step
loop's kernels (whose OpenMP barriers wait for a preempted thread) would otherwise share the
cores with a bomb's lexer and every stream would slow down with it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from trtllm_gateway.engine.guided.compile import DEFAULT_PARAMS
from trtllm_gateway.engine.guided.matcher import GuidedFactory, RowMatcher
from trtllm_gateway.engine.protocol import EngineError, GuidedDecoding, InvalidRequestError

_WORKERS = 2  # one slow build leaves a thread for everyone else's

Built = RowMatcher | EngineError


class GuidedWorker:
    def __init__(self, factory: GuidedFactory, timeout: float, wake: Callable[[], None]) -> None:
        self.factory = factory
        self.timeout = timeout
        self._wake = wake
        self._pool = ThreadPoolExecutor(
            _WORKERS, thread_name_prefix="guided", initializer=_lowest_priority
        )
        self._done: queue.SimpleQueue[tuple[str, int, Built]] = queue.SimpleQueue()
        # request_id -> (build ticket, deadline, param): a ticket tells a re-sent id's build
        # from the late result of one that timed out.
        self._pending: dict[str, tuple[int, float, str]] = {}
        self._tickets = itertools.count()

    def submit(self, request_id: str, guided: GuidedDecoding) -> None:
        ticket = next(self._tickets)
        deadline = time.monotonic() + self.timeout
        self._pending[request_id] = (ticket, deadline, DEFAULT_PARAMS[guided.kind])
        fut = self._pool.submit(self.factory.matcher, guided)

        def done(f: Future[RowMatcher]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is None:
                built: Built = f.result()
            elif isinstance(exc, EngineError):
                built = exc
            else:
                built = InvalidRequestError(f"constraint failed to compile: {exc}")
            self._done.put((request_id, ticket, built))
            self._wake()

        fut.add_done_callback(done)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._pending

    def forget(self, request_id: str) -> bool:
        """Drop a pending build (its request was aborted); True if there was one."""
        return self._pending.pop(request_id, None) is not None

    def ready(self) -> list[tuple[str, Built]]:
        """Builds finished since the last call, and those past their deadline (as errors)."""
        out: list[tuple[str, Built]] = []
        while True:
            try:
                request_id, ticket, built = self._done.get_nowait()
            except queue.Empty:
                break
            entry = self._pending.get(request_id)
            if entry is not None and entry[0] == ticket:
                del self._pending[request_id]
                out.append((request_id, built))
        now = time.monotonic()
        for request_id, (_, deadline, param) in list(self._pending.items()):
            if now >= deadline:
                del self._pending[request_id]
                message = (
                    f"the constraint took more than {self.timeout:g} s to compile "
                    "(--grammar-compile-timeout)"
                )
                out.append((request_id, InvalidRequestError(message, param=param)))
        return out

    def next_deadline(self) -> float | None:
        """Seconds until the earliest pending build times out, or None when none is pending."""
        if not self._pending:
            return None
        return max(0.0, min(d for _, d, _ in self._pending.values()) - time.monotonic())

    def pending(self) -> list[str]:
        return list(self._pending)

    def close(self) -> None:
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _lowest_priority() -> None:
    """Nice 19 for the calling thread (Linux threads have their own nice value)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
