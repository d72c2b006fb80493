"""Large reply blobs (KV exports) from the core process to the client through POSIX shared memory.

The core writes a blob of 1 MB or more into a fresh /dev/shm segment and sends only its name;
the client copies it out and unlinks the segment. Against one ZMQ frame over the core's ipc://
socket this saved 10-20 ms (about 10%) of pulling a 1024-token float32 KV export of SmolLM2
(45 MB) on a 2-core VM (docs/benchmarks.md). The frame stays the fallback: for small blobs, for
cores in a thread (inproc:// passes the frame without a copy) and when /dev/shm lacks room
(Docker's default is 64 MB, and writing past the room of a tmpfs segment is a SIGBUS, so the
room is checked first).
"""

from __future__ import annotations

import logging
import os
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

logger = logging.getLogger(__name__)

MIN_BYTES = 1 << 20  # below this the frame is as fast
SHM_DIR = "/dev/shm"


def has_room(size: int) -> bool:
    """True when /dev/shm can hold size bytes with as much again to spare."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= 2 * size


def put(blob: bytes) -> str | None:
    """Copy blob into a new segment; its name, or None when the frame should carry it."""
    if len(blob) < MIN_BYTES or not has_room(len(blob)):
        return None
    try:
        shm = SharedMemory(create=True, size=len(blob))
    except OSError as e:
        logger.warning("no shared memory segment for a %d-byte blob: %s", len(blob), e)
        return None
    buf = shm.buf
    assert buf is not None
    buf[: len(blob)] = blob
    # The client unlinks it; this process's resource tracker must not (nor warn at exit).
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    shm.close()
    return shm.name


def take(name: str, size: int) -> bytes:
    """The blob in segment name, which is unlinked; raises OSError if it is gone."""
    shm = SharedMemory(name=name)
    try:
        buf = shm.buf
        assert buf is not None
        return bytes(buf[:size])
    finally:
        shm.close()
        shm.unlink()


def discard(name: str) -> None:
    """Unlink a segment nobody will take (the core cleaning up at exit)."""
    try:
        shm = SharedMemory(name=name)
    except FileNotFoundError:
        return
    shm.close()
    shm.unlink()
