"""ResponseStore (routers/openai/responses/store.py): bounded by count, bytes and age, least
recently used
first, never a pinned (in flight) record; one sqlite file shared by two connections as by two
API server processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trtllm_gateway.routers.openai.responses.store import ResponseStore, StoreLimits

BIG = StoreLimits(max_count=100, max_bytes=10**6, max_age_s=3600)


def record(n: int, pad: int = 0) -> dict[str, object]:
    return {"response": {"id": f"r{n}"}, "conversation": ["x" * pad]}


def test_count_limit_evicts_the_least_recently_used() -> None:
    store = ResponseStore(":memory:", StoreLimits(max_count=2, max_bytes=10**6, max_age_s=3600))
    store.put("a", record(1))
    time.sleep(0.01)
    store.put("b", record(2))
    time.sleep(0.01)
    assert store.get("a") is not None  # a is now more recent than b
    time.sleep(0.01)
    store.put("c", record(3))
    assert store.get("b") is None
    assert store.get("a") is not None and store.get("c") is not None
    assert store.stats()[0] == 2


def test_bytes_limit() -> None:
    store = ResponseStore(":memory:", StoreLimits(max_count=100, max_bytes=250, max_age_s=3600))
    for n in range(4):
        store.put(f"r{n}", record(n, pad=80))
        time.sleep(0.01)
    count, size = store.stats()
    assert size <= 250 and count == 2
    assert store.get("r3") is not None and store.get("r0") is None
    assert not store.put("huge", record(9, pad=1000))  # alone past the limit: not stored
    assert store.get("huge") is None


def test_a_pinned_record_is_never_evicted() -> None:
    store = ResponseStore(":memory:", StoreLimits(max_count=1, max_bytes=10**6, max_age_s=3600))
    store.put("a", record(1))
    assert store.get("a", pin=True) is not None  # a request in flight reads it
    store.put("b", record(2))
    assert store.get("a") is not None  # over the count, but in flight
    store.unpin("a")
    store.put("c", record(3))
    assert store.get("a") is None


def test_age_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    store = ResponseStore(":memory:", StoreLimits(max_count=10, max_bytes=10**6, max_age_s=60))
    store.put("old", record(1))
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 61)
    assert store.get("old") is None


def test_delete() -> None:
    store = ResponseStore(":memory:", BIG)
    store.put("a", record(1))
    assert store.delete("a") and not store.delete("a")
    assert store.get("a") is None


def test_one_file_two_processes_view(tmp_path: Path) -> None:
    path = str(tmp_path / "responses")
    one, two = ResponseStore(path, BIG), ResponseStore(path, BIG)
    one.put("a", record(1))
    assert two.get("a") == record(1)
    assert two.delete("a")
    assert one.get("a") is None
    one.close()
    two.close()
