"""How much this process's threads wait for a CPU: Linux's per-thread schedstat, sampled.

Each /proc/self/task/<tid>/schedstat holds a thread's time on a CPU and its time runnable but
waiting for one (nanoseconds). Summed over the process's threads and divided by the wall time
between two samples, the wait is ~0 while every runnable thread has a core and grows when other
processes share the cores (0.34-0.49 at load 3 on the 2-core test VM while stepping a batch of 8,
docs/benchmarks.md): the signal cpu_threads.py uses to decide whether a parallel call's barrier
can count on its threads being scheduled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

TASKS = Path("/proc/self/task")


def waited_ns(tasks: Path = TASKS) -> int | None:
    """Nanoseconds the process's threads have spent runnable but not running; None without
    schedstat (not Linux, or a kernel without CONFIG_SCHED_INFO)."""
    total, seen = 0, False
    try:
        tids = os.listdir(tasks)
    except OSError:
        return None
    for tid in tids:
        try:
            total += int((tasks / tid / "schedstat").read_text().split()[1])
            seen = True
        except (OSError, IndexError, ValueError):  # a thread that just ended
            continue
    return total if seen else None


class RunQueueWait:
    """The wait share over the last `every_s` seconds or more, sampled only when asked."""

    def __init__(
        self,
        every_s: float = 0.5,
        read: Callable[[], int | None] = waited_ns,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._every_s = every_s
        self._read = read
        self._clock = clock
        self._last: tuple[float, int] | None = None

    def share(self) -> float | None:
        """The new share if `every_s` has passed since the previous one, else None (cheap: one
        clock read; ~0.1 ms for the files when it samples)."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < self._every_s:
            return None
        waited = self._read()
        if waited is None:
            return None
        last, self._last = self._last, (now, waited)
        if last is None:
            return None
        return (waited - last[1]) / 1e9 / (now - last[0])
