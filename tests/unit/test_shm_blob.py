"""core/shm_blob.py: a KV blob handed over in POSIX shared memory, and when it is not."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from trtllm_gateway.engine.transport import shm_blob


def segments() -> set[str]:
    return set(os.listdir(shm_blob.SHM_DIR))


def test_put_then_take_hands_the_bytes_over_and_unlinks() -> None:
    blob = os.urandom(shm_blob.MIN_BYTES + 123)
    before = segments()
    name = shm_blob.put(blob)
    assert name is not None and name.lstrip("/") in segments() - before
    assert shm_blob.take(name, len(blob)) == blob
    assert segments() <= before
    with pytest.raises(FileNotFoundError):
        shm_blob.take(name, len(blob))  # taken once only


def test_small_blobs_and_a_full_dev_shm_stay_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shm_blob.put(b"x" * 1000) is None
    # Docker's default /dev/shm is 64 MB: a blob that does not fit twice over is not written
    # (writing past a tmpfs's room would be a SIGBUS in the core).
    room = SimpleNamespace(f_bavail=(3 * shm_blob.MIN_BYTES) // 4096, f_frsize=4096)
    monkeypatch.setattr(shm_blob.os, "statvfs", lambda _path: room)
    assert not shm_blob.has_room(2 * shm_blob.MIN_BYTES)
    assert shm_blob.put(os.urandom(2 * shm_blob.MIN_BYTES)) is None
    monkeypatch.setattr(shm_blob.os, "statvfs", lambda _path: (_ for _ in ()).throw(OSError()))
    assert not shm_blob.has_room(1)


def test_discard_cleans_up_what_nobody_took() -> None:
    before = segments()
    name = shm_blob.put(os.urandom(shm_blob.MIN_BYTES))
    assert name is not None
    shm_blob.discard(name)
    assert segments() <= before
    shm_blob.discard(name)  # already gone: nothing to do
