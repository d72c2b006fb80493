"""ThreadLauncher: the same core loop in a thread of the gateway process (--no-engine-process).

Messages cross inproc:// sockets of one ZMQ context, encoded exactly as between processes, so
the engine tests, the offline benchmarks and --no-engine-process all run the message path that
serves users, but the spawn. The core loads and steps in this one thread: torch's OpenMP threads
belong to the thread that runs a parallel region, and a model loaded in one thread and stepped
in another leaves two teams of them; with more OpenMP threads than cores libgomp stops
spin-waiting and every parallel op waits to wake its threads (a CPU decode step took 1.3-2x as
long, bench.cpu_step).
"""

from __future__ import annotations

import threading

import zmq

from trtllm_gateway.engine.transport.launch import CoreFactory
from trtllm_gateway.engine.transport.loop import Addresses, Core, run_core


class ThreadLauncher:
    transport = "inproc"

    def __init__(self, factory: CoreFactory) -> None:
        self.factory = factory
        self._thread: threading.Thread | None = None
        self._code: int | None = None
        self.core: Core | None = None  # once made: a look inside for tests and debugging

    def _make(self) -> Core:
        self.core = self.factory()
        return self.core

    def start(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses) -> None:
        def run() -> None:
            self._code = run_core(self._make, ctx, addrs, shares_gil=True)

        self._thread = threading.Thread(target=run, name="engine-core", daemon=True)
        self._thread.start()

    @property
    def sentinel(self) -> int | None:
        return None  # a thread that ends sends Dead on its way out (run_core's finally)

    @property
    def exitcode(self) -> int | None:
        return self._code

    @property
    def pid(self) -> int | None:
        return None

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def kill(self) -> None:
        """A thread cannot be killed; Stop ends it, and it is a daemon."""
