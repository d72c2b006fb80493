"""The run-queue wait gauge (run_queue.py): it tells cpu_threads.py whether cores are shared."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtllm_gateway.engine.builtin.run_queue import RunQueueWait, waited_ns


def test_the_share_is_the_wait_between_samples_over_the_wall_time() -> None:
    now = [0.0]
    waits = iter([10**9, 10**9 + 3 * 10**8, 10**9 + 4 * 10**8])
    gauge = RunQueueWait(every_s=0.5, read=lambda: next(waits), clock=lambda: now[0])
    assert gauge.share() is None  # the first sample only sets the baseline
    now[0] = 0.2
    assert gauge.share() is None  # too soon: no file read (the iterator is not advanced)
    now[0] = 1.0
    assert gauge.share() == pytest.approx(0.3)  # 0.3 s waited in 1 s
    now[0] = 3.0
    assert gauge.share() == pytest.approx(0.05)


def test_no_schedstat_means_no_share() -> None:
    gauge = RunQueueWait(every_s=0.0, read=lambda: None)
    assert gauge.share() is None and gauge.share() is None


def test_waited_ns_sums_the_threads_and_skips_those_that_ended(tmp_path: Path) -> None:
    for tid, text in (("1", "500 70 3\n"), ("2", "900 30 8\n"), ("3", "")):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "schedstat").write_text(text)
    (tmp_path / "4").mkdir()  # a thread that ended between the listing and the read
    assert waited_ns(tmp_path) == 100
    assert waited_ns(tmp_path / "missing") is None


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or waited_ns() is None, reason="Linux schedstat"
)
def test_a_thread_that_shares_its_core_with_a_busy_process_waits() -> None:
    """The real signal: this thread pinned to one core beside a busy child waits about half
    the time."""
    before = os.sched_getaffinity(0)
    cpu = min(before)

    def spin_share() -> float:
        w0, t0 = waited_ns(), time.monotonic()
        while time.monotonic() - t0 < 0.4:
            pass
        w1 = waited_ns()
        assert w0 is not None and w1 is not None
        return (w1 - w0) / 1e9 / (time.monotonic() - t0)

    os.sched_setaffinity(0, {cpu})
    try:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # inherits the pin
        try:
            time.sleep(0.1)
            shared = spin_share()
        finally:
            busy.kill()
            busy.wait()
    finally:
        os.sched_setaffinity(0, before)
    assert shared > 0.2
