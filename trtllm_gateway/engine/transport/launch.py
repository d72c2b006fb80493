"""Launcher: how a CoreClient starts the core loop (engine/transport/loop.py) and watches it.

process.py runs it in a spawned process (production); inproc.py in a thread (tests, debugging).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import zmq

from trtllm_gateway.engine.transport.loop import Addresses, Core

# Makes the core where it runs; a process launcher pickles it, so it carries all the core gets.
CoreFactory = Callable[[], Core]


class Launcher(Protocol):
    transport: str  # "ipc" or "inproc": how the client names its addresses

    def start(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses) -> None: ...

    @property
    def sentinel(self) -> int | None:
        """A file descriptor readable once the core has exited (None: no such thing)."""
        ...

    @property
    def exitcode(self) -> int | None: ...

    @property
    def pid(self) -> int | None: ...

    def join(self, timeout: float) -> bool:
        """Wait for the core to exit; False if it is still running."""
        ...

    def kill(self) -> None: ...
