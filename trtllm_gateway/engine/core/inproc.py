"""ThreadLauncher: the same core loop in a thread of the gateway process (tests, debugging).

Messages cross inproc:// sockets of one ZMQ context, encoded exactly as between processes, so a
test of the client over a thread exercises the whole wire path but the spawn.
"""

from __future__ import annotations

import threading

import zmq

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.core.launch import CoreFactory
from trtllm_gateway.engine.core.loop import Addresses, run_core


class ThreadLauncher:
    transport = "inproc"

    def __init__(self, settings: Settings, factory: CoreFactory) -> None:
        self.settings = settings
        self.factory = factory
        self._thread: threading.Thread | None = None
        self._code: int | None = None

    def start(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses) -> None:
        def run() -> None:
            self._code = run_core(lambda: self.factory(self.settings), ctx, addrs)

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
