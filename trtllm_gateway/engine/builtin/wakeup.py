"""Wakeup: a pipe whose read end the core loop polls, set by work finished off the step loop.

Image encodes (core_vision.py) and grammar builds (core_guided.py) finish on threads of their
own; each result is queued and the pipe written, so the core loop, asleep in poll, wakes at
once to admit the request instead of waiting for its next message or idle tick.
"""

from __future__ import annotations

import contextlib
import os
import threading


class Wakeup:
    def __init__(self) -> None:
        self.fd, self._w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._w, False)  # a full pipe already wakes the loop: never block
        self._lock = threading.Lock()
        self._closed = False

    def set(self) -> None:
        """Thread-safe; after close() it does nothing: a late result at shutdown must not
        write to whatever file has reused the descriptor's number."""
        with self._lock:
            if not self._closed:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._w, b"\0")

    def clear(self) -> None:
        """Drain the pipe (the loop, before it collects what finished)."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self.fd)
            os.close(self._w)
