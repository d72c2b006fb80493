"""GuidedWorker: grammar builds off the step loop, their wake-ups, deadlines, aborts and errors."""

from __future__ import annotations

import select
import threading
import time
from typing import Any

import pytest

from trtllm_gateway.engine.builtin.core_guided import GuidedWorker
from trtllm_gateway.engine.builtin.wakeup import Wakeup
from trtllm_gateway.engine.protocol import GuidedDecoding, InvalidRequestError

REGEX = GuidedDecoding("regex", "a+")


class FakeFactory:
    """matcher() blocks until released, then returns (result, call number) or raises."""

    def __init__(self, result: Any = "matcher") -> None:
        self.release = threading.Event()
        self.result = result
        self.threads: list[str] = []

    def matcher(self, guided: GuidedDecoding) -> Any:
        self.threads.append(threading.current_thread().name)
        call = len(self.threads)
        assert self.release.wait(10)
        if isinstance(self.result, BaseException):
            raise self.result
        return (self.result, call)


def wait_ready(worker: GuidedWorker, timeout: float = 5.0) -> list[tuple[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = worker.ready()
        if out:
            return out
        time.sleep(0.01)
    raise AssertionError("nothing became ready")


@pytest.fixture
def wakeup() -> Any:
    w = Wakeup()
    yield w
    w.close()


def readable(fd: int, wait_s: float = 1.0) -> bool:
    return bool(select.select([fd], [], [], wait_s)[0])


def test_a_build_runs_off_the_caller_and_wakes_the_loop(wakeup: Wakeup) -> None:
    factory = FakeFactory()
    worker = GuidedWorker(factory, 5.0, wakeup.set)  # type: ignore[arg-type]
    worker.submit("r1", REGEX)
    assert "r1" in worker and worker.ready() == []  # submit did not wait for the build
    assert not readable(wakeup.fd, 0.1)
    factory.release.set()
    assert readable(wakeup.fd)
    assert wait_ready(worker) == [("r1", ("matcher", 1))]
    assert factory.threads[0].startswith("guided")
    assert "r1" not in worker and worker.next_deadline() is None
    wakeup.clear()
    worker.close()


def test_a_slow_build_fails_its_request_at_the_deadline(wakeup: Wakeup) -> None:
    factory = FakeFactory()
    worker = GuidedWorker(factory, 0.2, wakeup.set)  # type: ignore[arg-type]
    worker.submit("bomb", REGEX)
    assert 0 < (worker.next_deadline() or 0) <= 0.2
    time.sleep(0.25)
    ((request_id, err),) = worker.ready()
    assert request_id == "bomb"
    assert isinstance(err, InvalidRequestError)
    assert err.param == "structured_outputs.regex"
    assert "--grammar-compile-timeout" in str(err)
    factory.release.set()  # the late result is dropped, not delivered twice
    time.sleep(0.1)
    assert worker.ready() == []
    worker.close()


def test_a_resent_id_is_not_answered_by_the_late_build(wakeup: Wakeup) -> None:
    slow = FakeFactory("old")
    worker = GuidedWorker(slow, 0.1, wakeup.set)  # type: ignore[arg-type]
    worker.submit("r", REGEX)
    time.sleep(0.15)
    assert isinstance(worker.ready()[0][1], InvalidRequestError)
    worker.timeout = 5.0
    worker.submit("r", REGEX)  # the same id again, while the first build still runs
    slow.release.set()
    assert wait_ready(worker) == [("r", ("old", 2))]  # the second build's own result
    time.sleep(0.1)
    assert worker.ready() == []  # the first build's result was dropped
    worker.close()


def test_forget_drops_a_pending_build(wakeup: Wakeup) -> None:
    factory = FakeFactory()
    worker = GuidedWorker(factory, 5.0, wakeup.set)  # type: ignore[arg-type]
    worker.submit("r", REGEX)
    assert worker.forget("r") and not worker.forget("r")
    factory.release.set()
    time.sleep(0.1)
    assert worker.ready() == []
    worker.close()


def test_build_errors_become_invalid_requests(wakeup: Wakeup) -> None:
    refused = InvalidRequestError("bad grammar", param="structured_outputs.grammar")
    for raised, expected in [(refused, "bad grammar"), (RuntimeError("boom"), "boom")]:
        factory = FakeFactory(raised)
        factory.release.set()
        worker = GuidedWorker(factory, 5.0, wakeup.set)  # type: ignore[arg-type]
        worker.submit("r", REGEX)
        ((_, err),) = wait_ready(worker)
        assert isinstance(err, InvalidRequestError) and expected in str(err)
        worker.close()


def test_wakeup_set_clear_and_close() -> None:
    w = Wakeup()
    w.set()
    w.set()
    assert readable(w.fd, 0.5)
    w.clear()
    assert not readable(w.fd, 0.05)
    w.close()
    w.set()  # a late result after close writes nowhere (the fd number may be reused)
    w.close()  # idempotent
