"""Admission control: a bounded count of engine requests in flight, reserved before any work.

A generation route reserves one slot per engine request (n choices x prompts) before templating,
media fetches or remote prefill, and releases it on every exit path. The limit is the engine's
running batch (--max-batch-size) plus --max-queued-requests: "queued" means admitted by the
gateway beyond what the engine can run at once, the same quantity as vLLM's and SGLang's waiting
queue. Past the limit, or once draining, `reserve` raises a 503 (Retry-After) at once.

One HTTP request runs at most --max-running-choices of its engine requests at once (the fan-out
starts the rest as those end), and reserves only that many: a request of 2,048 choices neither
fills the engine's batch ahead of everyone else (the scheduler is first come, first served) nor
takes the whole admission limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from trtllm_gateway.web.errors import ServiceUnavailableError
from trtllm_gateway.web.shared_counts import SharedCounts

logger = logging.getLogger(__name__)


class Slot:
    """Reserved capacity; `release()` is idempotent so every exit path may call it."""

    __slots__ = ("_admission", "_also", "_released", "weight")

    def __init__(self, admission: AdmissionControl, weight: int) -> None:
        self._admission = admission
        self.weight = weight
        self._released = False
        self._also: list[Callable[[], None]] = []

    def on_release(self, callback: Callable[[], None]) -> None:
        """Run `callback` with the release: what else the request holds until its response
        has ended (its images' decoded-pixel budget)."""
        self._also.append(callback)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release(self.weight)
            for callback in self._also:
                callback()


class AdmissionControl:
    """In-flight engine requests of one app. Event-loop only: reserve/release never await.

    With --api-server-count N the limit counts every server's requests (shared: SharedCounts);
    in_flight stays this process's own, which its drain waits for.
    """

    def __init__(
        self,
        running: int,
        queued: int | None,
        per_request: int | None = None,
        shared: SharedCounts | None = None,
    ) -> None:
        """per_request: the most engine requests one HTTP request runs at once (None: all)."""
        self.per_request = per_request
        self.shared = shared
        self._queued_limit = queued
        self.capacity = None if queued is None else running + queued
        self.running_limit = running
        self.in_flight = 0
        self.rejected = {"queue_full": 0, "draining": 0}
        self.closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    def set_running_limit(self, running: int) -> None:
        """The engine's own batch size once it is known (engine args may override the flag)."""
        self.running_limit = running
        queued = self._queued_limit
        self.capacity = None if queued is None else running + queued

    @property
    def total_in_flight(self) -> int:
        """Every API server's requests in flight (this one's alone without shared counts)."""
        return self.in_flight if self.shared is None else self.shared.in_flight

    @property
    def queued(self) -> int:
        """Admitted requests beyond what the engine runs at once."""
        return max(0, self.total_in_flight - self.running_limit)

    def rejections(self) -> dict[str, int]:
        """Refusals by reason, of every API server."""
        return dict(self.rejected) if self.shared is None else self.shared.rejected()

    def reserve(self, weight: int = 1) -> Slot:
        """A slot for `weight` engine requests (at most per_request of them run at once, so
        that many count), or ServiceUnavailableError (503 + Retry-After).

        An idle gateway admits any request, so one larger than the limit is served alone.
        """
        if self.per_request is not None:
            weight = min(weight, self.per_request)
        if self.closed:
            self.rejected["draining"] += 1
            if self.shared is not None:
                self.shared.refused_draining()
            raise ServiceUnavailableError("The server is shutting down.", code="draining")
        cap = self.capacity
        if self.shared is not None:
            admitted = self.shared.try_reserve(weight, cap)
        else:
            admitted = cap is None or self.in_flight == 0 or self.in_flight + weight <= cap
        if not admitted:
            self.rejected["queue_full"] += 1
            raise ServiceUnavailableError(
                f"The server is overloaded ({self.total_in_flight} requests in flight, "
                f"limit {cap}); retry shortly.",
                code="queue_full",
            )
        self.in_flight += weight
        self._idle.clear()
        return Slot(self, weight)

    def _release(self, weight: int) -> None:
        if self.shared is not None:
            self.shared.release(weight)
        self.in_flight -= weight
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    def close(self) -> None:
        """Refuse every new reservation (drain); safe to call from a signal handler."""
        self.closed = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing is in flight, False if timeout_s passed first."""
        if self.in_flight == 0:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
