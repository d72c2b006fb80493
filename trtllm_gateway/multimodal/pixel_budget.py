"""PixelBudget: decoded image pixels in flight across concurrent requests, a weighted semaphore.

--max-image-pixels bounds one image, but a 4 KB 1-bit PNG can be a legal 36 MP image: eight
concurrent requests with eight different ones hold 8 x 108 MB of RGB (issue 24). Each request
takes a PixelLease, reserves the pixels of all its images at once (sizes read from the headers,
before decoding) and keeps them until its response ends, when the images are dropped. All at
once, so that two requests can never each hold part of what they need and wait on each other.

Waiters are served first come, first served: a large request is not starved by a stream of
small ones. Event-loop only: acquire and release never cross threads.

With --api-server-count N the budget is every server's (SharedPixels: the supervisor's shared
counts file), so N servers do not hold N budgets' pixels. Each server keeps its own waiters in
order; room that another server gives back is not announced, so while a server has waiters it
looks again every POLL_S. Across servers the order is not kept: a waiter in one server can be
passed by requests that fit in another, and then ends in its 503 after its wait.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.multimodal.errors import MediaBusyError, MediaRejectedError

POLL_S = 0.02  # a shared budget's waiters look for room given back by other servers


class SharedPixels(Protocol):
    """The pixels every API server holds (web/shared_counts.py: SharedCounts), each call
    atomic across the processes."""

    def take_pixels(self, pixels: int, capacity: int) -> bool: ...
    def give_pixels(self, pixels: int) -> None: ...
    def pixel_waiters(self, delta: int) -> None: ...
    def pixel_counts(self) -> tuple[int, int, int]: ...


def create_pixel_budget(config: MediaConfig, shared: SharedPixels | None = None) -> PixelBudget:
    """--max-image-pixels-in-flight, unset: room for two of the largest images at once."""
    capacity = config.max_image_pixels_in_flight
    return PixelBudget(2 * config.max_image_pixels if capacity is None else capacity, shared)


@dataclass(slots=True)
class _Waiter:
    pixels: int
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class PixelBudget:
    """At most `capacity` decoded pixels held by requests at once; 0 turns the bound off."""

    def __init__(self, capacity: int, shared: SharedPixels | None = None) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._shared = shared
        self._in_flight = 0
        self._peak = 0
        self._waiters: deque[_Waiter] = deque()
        self._poller: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return self._in_flight if self._shared is None else self._shared.pixel_counts()[0]

    @property
    def peak(self) -> int:
        """The most ever held at once (tests and /metrics read it)."""
        return self._peak if self._shared is None else self._shared.pixel_counts()[1]

    @property
    def waiting(self) -> int:
        return len(self._waiters) if self._shared is None else self._shared.pixel_counts()[2]

    def lease(self) -> PixelLease:
        return PixelLease(self)

    async def _acquire(self, pixels: int, wait_s: float) -> None:
        if self.capacity and pixels > self.capacity:
            raise MediaRejectedError(
                f"the request's images have {pixels} pixels, more than the server decodes at "
                f"once ({self.capacity}, --max-image-pixels-in-flight)",
                code="image_too_large",
            )
        if not self._waiters and self._take(pixels):
            return
        waiter = _Waiter(pixels)
        self._enqueue(waiter)
        try:
            async with asyncio.timeout(wait_s):
                await waiter.granted
        except BaseException as exc:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._give(pixels)  # granted just as the wait ended: hand it back
            else:
                waiter.granted.cancel()
                if waiter in self._waiters:  # _wake drops a cancelled one it meets first
                    self._waiters.remove(waiter)
                    self._left(1)
                self._wake()  # the head may have blocked smaller requests behind it
            if isinstance(exc, TimeoutError):
                raise MediaBusyError(
                    f"the server is decoding too many image pixels at once; waited {wait_s:g} s"
                ) from None
            raise

    def _take(self, pixels: int) -> bool:
        """Hold pixels more if they fit."""
        if self._shared is not None:
            return self._shared.take_pixels(pixels, self.capacity)
        if self.capacity and self._in_flight + pixels > self.capacity:
            return False
        self._in_flight += pixels
        self._peak = max(self._peak, self._in_flight)
        return True

    def _give(self, pixels: int) -> None:
        if self._shared is not None:
            self._shared.give_pixels(pixels)
        else:
            self._in_flight -= pixels
        self._wake()

    def _enqueue(self, waiter: _Waiter) -> None:
        self._waiters.append(waiter)
        if self._shared is not None:
            self._shared.pixel_waiters(1)
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll())

    def _left(self, n: int) -> None:
        """n waiters left the queue (granted, or gone)."""
        if self._shared is not None:
            self._shared.pixel_waiters(-n)

    async def _poll(self) -> None:
        """Room given back by another server wakes nobody here: look for it while anyone
        waits."""
        while self._waiters:
            await asyncio.sleep(POLL_S)
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            head = self._waiters[0]
            if head.granted.done():  # cancelled: its task has not run its cleanup yet
                self._waiters.popleft()
                self._left(1)
                continue
            if not self._take(head.pixels):
                return
            self._waiters.popleft()
            self._left(1)
            head.granted.set_result(None)


class PixelLease:
    """One request's share of the budget; release() is idempotent, for every exit path."""

    __slots__ = ("_budget", "pixels")

    def __init__(self, budget: PixelBudget) -> None:
        self._budget = budget
        self.pixels = 0

    async def acquire(self, pixels: int, wait_s: float) -> None:
        """Reserve `pixels` more, waiting up to `wait_s` seconds (MediaBusyError, a 503);
        more than the whole budget is a MediaRejectedError (400) at once."""
        if pixels <= 0:
            return
        await self._budget._acquire(pixels, wait_s)
        self.pixels += pixels

    def release(self) -> None:
        pixels, self.pixels = self.pixels, 0
        if pixels:
            self._budget._give(pixels)
