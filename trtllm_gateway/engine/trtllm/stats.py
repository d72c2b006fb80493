"""Iteration stats and KV-cache events from TensorRT-LLM, polled on the event loop.

TensorRT-LLM hands out one shared iterator per LLM that ends after `timeout` seconds without
data and only re-arms when a request is submitted; before the first request stats are empty
and KV events assert. So both pollers wait for the first request and re-enter after each
timeout. The latest numbers feed EngineHealth (and so /metrics); KV events fan out to
subscribers (KV-aware routers) through bounded queues that drop the oldest on overflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = 2.0
IDLE_SLEEP_S = 0.5


@dataclass(slots=True)
class StatsSnapshot:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_active_blocks: int = 0  # kvCacheStats.usedNumBlocks, as Dynamo's publisher reads it
    kv_total_blocks: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


class StatsPoller:
    """Owns the two polling tasks; start() after the LLM exists, stop() before shutdown."""

    def __init__(self, llm: Any, *, kv_events: bool) -> None:
        self._llm = llm
        self._kv_events = kv_events
        self.snapshot = StatsSnapshot()
        self._last_blocks = (0, 0)  # reusedBlocks, missedBlocks as last reported
        self._first_request = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._poll_stats(), name="trtllm-stats"))
        if self._kv_events:
            self._tasks.append(asyncio.create_task(self._poll_kv_events(), name="trtllm-kv"))

    def request_submitted(self) -> None:
        """Called after each generate_async: the iterators exist (and re-armed) from now on."""
        self._first_request.set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def kv_events(self, maxsize: int = 1024) -> AsyncIterator[dict[str, Any]]:
        """Stream KV-cache event dicts (TensorRT-LLM's JSON shape) until the caller stops."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize)
        self._subscribers.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.discard(queue)

    async def _poll_stats(self) -> None:
        await self._first_request.wait()
        while True:
            got = False
            async for stats in self._llm.get_stats_async(timeout=POLL_TIMEOUT_S):
                got = True
                self._apply(stats)
            if not got:
                self.snapshot.running = self.snapshot.waiting = 0
                await asyncio.sleep(IDLE_SLEEP_S)

    async def _poll_kv_events(self) -> None:
        await self._first_request.wait()
        while True:
            got = False
            async for event in self._llm.get_kv_cache_events_async(timeout=POLL_TIMEOUT_S):
                got = True
                self._publish(event)
            if not got:
                await asyncio.sleep(IDLE_SLEEP_S)

    def _apply(self, stats: dict[str, Any]) -> None:
        snap = self.snapshot
        snap.running = int(stats.get("numActiveRequests", 0))
        snap.waiting = int(stats.get("numQueuedRequests", 0))
        kv = stats.get("kvCacheStats") or {}
        total = int(kv.get("maxNumBlocks", 0))
        if total > 0:
            snap.kv_active_blocks = int(kv.get("usedNumBlocks", 0))
            snap.kv_total_blocks = total
            snap.kv_usage = min(1.0, snap.kv_active_blocks / total)
        # Lifetime totals in every iteration (the C++ KV cache manager's counters): add the
        # change since the last report. A total that went down means a new manager: restart.
        if "reusedBlocks" not in kv:
            return
        reused, missed = int(kv["reusedBlocks"]), int(kv.get("missedBlocks", 0))
        last_reused, last_missed = self._last_blocks
        if reused < last_reused or missed < last_missed:
            last_reused = last_missed = 0
        snap.prefix_cache_hits += reused - last_reused
        snap.prefix_cache_queries += (reused - last_reused) + (missed - last_missed)
        self._last_blocks = (reused, missed)

    def _publish(self, event: dict[str, Any]) -> None:
        for queue in self._subscribers:
            if queue.full():
                queue.get_nowait()  # a slow router loses the oldest event, not the engine
            queue.put_nowait(event)
