"""SharedCounts: admission's counters shared by the API servers of --api-server-count N.

The supervisor creates one small file; each server maps it and changes it under an exclusive
flock, so "in flight" and the refusals count every server's requests: a request over the limit
gets its 503 whichever process accepted its connection. A reservation costs one lock round (a few
microseconds), once per request, never per token. A server that dies holding slots would leak
them, but then the supervisor stops every server.

It also counts the servers that have loaded: each says it is ready only once every one has
(servers_ready), since any of them may take the next connection. Before, /health answered 200 from
the first server ready while another still answered 503 "loading" for ~0.2 s (a CI run's
request landed there).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from collections.abc import Iterator

_FIELDS = (
    "in_flight",
    "queue_full",
    "draining",
    "servers",
    "servers_ready",
    # The decoded-pixel budget (multimodal/pixel_budget.py: SharedPixels), every server's.
    "pixels",
    "pixels_peak",
    "pixels_waiting",
)
_LAYOUT = struct.Struct(f"<{len(_FIELDS)}q")


class SharedCounts:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, _LAYOUT.size)

    @staticmethod
    def create(path: str, servers: int = 1) -> None:
        """The file, made once by the supervisor before any server starts."""
        with open(path, "wb") as f:
            f.write(_LAYOUT.pack(0, 0, 0, servers, 0, 0, 0, 0))

    def try_reserve(self, weight: int, capacity: int | None) -> bool:
        """Add weight to in_flight unless that passes capacity while others are in flight
        (an idle gateway admits any request); a refusal counts as queue_full."""
        with self._locked() as counts:
            in_flight = counts[0]
            if capacity is not None and in_flight > 0 and in_flight + weight > capacity:
                counts[1] += 1
                return False
            counts[0] += weight
            return True

    def release(self, weight: int) -> None:
        with self._locked() as counts:
            counts[0] = max(0, counts[0] - weight)

    def refused_draining(self) -> None:
        with self._locked() as counts:
            counts[2] += 1

    def mark_ready(self) -> None:
        """This server has loaded (once per server)."""
        with self._locked() as counts:
            counts[4] += 1

    def servers_ready(self) -> tuple[int, int]:
        """(servers loaded, servers)."""
        counts = _LAYOUT.unpack_from(self._map)
        return int(counts[4]), int(counts[3])

    @property
    def in_flight(self) -> int:
        return int(_LAYOUT.unpack_from(self._map)[0])

    def rejected(self) -> dict[str, int]:
        counts = _LAYOUT.unpack_from(self._map)
        return {"queue_full": counts[1], "draining": counts[2]}

    # --- the decoded-pixel budget (SharedPixels) ------------------------------------------
    def take_pixels(self, pixels: int, capacity: int) -> bool:
        """Add pixels to those held unless that passes capacity (0: no bound)."""
        with self._locked() as counts:
            if capacity and counts[5] + pixels > capacity:
                return False
            counts[5] += pixels
            counts[6] = max(counts[6], counts[5])
            return True

    def give_pixels(self, pixels: int) -> None:
        with self._locked() as counts:
            counts[5] = max(0, counts[5] - pixels)

    def pixel_waiters(self, delta: int) -> None:
        with self._locked() as counts:
            counts[7] = max(0, counts[7] + delta)

    def pixel_counts(self) -> tuple[int, int, int]:
        """(pixels held, the most held at once, requests waiting), every server's."""
        counts = _LAYOUT.unpack_from(self._map)
        return int(counts[5]), int(counts[6]), int(counts[7])

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[int]]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            counts = list(_LAYOUT.unpack_from(self._map))
            yield counts
            _LAYOUT.pack_into(self._map, 0, *counts)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
