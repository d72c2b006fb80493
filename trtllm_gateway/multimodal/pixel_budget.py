"""PixelBudget: decoded image pixels in flight across concurrent requests, a weighted semaphore.

--max-image-pixels bounds one image, but a 4 KB 1-bit PNG can be a legal 36 MP image: eight
concurrent requests with eight different ones hold 8 x 108 MB of RGB (issue 24). Each request
takes a PixelLease, reserves the pixels of all its images at once (sizes read from the headers,
before decoding) and keeps them until its response ends, when the images are dropped. All at
once, so that two requests can never each hold part of what they need and wait on each other.

Waiters are served first come, first served: a large request is not starved by a stream of
small ones. Event-loop only: acquire and release never cross threads.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.multimodal.errors import MediaBusyError, MediaRejectedError


def create_pixel_budget(config: MediaConfig) -> PixelBudget:
    """--max-image-pixels-in-flight, unset: room for two of the largest images at once."""
    capacity = config.max_image_pixels_in_flight
    return PixelBudget(2 * config.max_image_pixels if capacity is None else capacity)


@dataclass(slots=True)
class _Waiter:
    pixels: int
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class PixelBudget:
    """At most `capacity` decoded pixels held by requests at once; 0 turns the bound off."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self.in_flight = 0
        self.peak = 0  # the most ever held at once (tests and /metrics read it)
        self._waiters: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def lease(self) -> PixelLease:
        return PixelLease(self)

    async def _acquire(self, pixels: int, wait_s: float) -> None:
        if self.capacity and pixels > self.capacity:
            raise MediaRejectedError(
                f"the request's images have {pixels} pixels, more than the server decodes at "
                f"once ({self.capacity}, --max-image-pixels-in-flight)",
                code="image_too_large",
            )
        if not self._waiters and self._fits(pixels):
            self._take(pixels)
            return
        waiter = _Waiter(pixels)
        self._waiters.append(waiter)
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
                self._wake()  # the head may have blocked smaller requests behind it
            if isinstance(exc, TimeoutError):
                raise MediaBusyError(
                    f"the server is decoding too many image pixels at once; waited {wait_s:g} s"
                ) from None
            raise

    def _fits(self, pixels: int) -> bool:
        return not self.capacity or self.in_flight + pixels <= self.capacity

    def _take(self, pixels: int) -> None:
        self.in_flight += pixels
        self.peak = max(self.peak, self.in_flight)

    def _give(self, pixels: int) -> None:
        self.in_flight -= pixels
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            head = self._waiters[0]
            if head.granted.done():  # cancelled: its task has not run its cleanup yet
                self._waiters.popleft()
                continue
            if not self._fits(head.pixels):
                return
            self._waiters.popleft()
            self._take(head.pixels)
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
