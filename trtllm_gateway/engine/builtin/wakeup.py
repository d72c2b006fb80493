"""Wakeup: a pipe whose read end the core loop polls, set by work finished off the step loop.

Image encodes (core_vision.py) and grammar builds (core_guided.py) finish on threads of their
own; each result is queued and the pipe written, so the core loop, asleep in poll, wakes at
once to admit the request instead of waiting for its next message or idle tick.
"""

from __future__ import annotations

import contextlib
import os


class Wakeup:
    def __init__(self) -> None:
        self.fd, self._w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._w, False)  # a full pipe already wakes the loop: never block

    def set(self) -> None:
        """Thread-safe; a write after close() is ignored (a late result at shutdown)."""
        with contextlib.suppress(OSError):
            os.write(self._w, b"\0")

    def clear(self) -> None:
        """Drain the pipe (the loop, before it collects what finished)."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        for fd in (self.fd, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
