"""The TensorRT-LLM results in flight, by our request_id: abort, release, drain.

TensorRT-LLM's GenerationResult.abort() calls its executor through a weakref that
LLM.shutdown() (or a dead worker) leaves empty, so an abort may raise at any time after that;
nothing here lets it escape. A result given up before it finished is aborted and read to its
end in the background, so TensorRT-LLM frees its KV cache and slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0
STOP_WAIT_S = 5.0  # stop() waits this long for the drains


class InFlight:
    """request_id -> TensorRT-LLM result, for the requests submitted and not yet released."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self._drains: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self.results)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.results

    def add(self, request_id: str, result: Any) -> None:
        self.results[request_id] = result

    def abort(self, request_id: str) -> None:
        """Ask TensorRT-LLM to cancel one request (its stream then ends 'cancelled'); quiet."""
        result = self.results.get(request_id)
        if result is not None:
            _try_abort(request_id, result)

    def abort_all(self) -> None:
        for request_id, result in list(self.results.items()):
            _try_abort(request_id, result)

    def release(self, request_id: str, result: Any, *, finished: bool, alive: bool) -> None:
        """Forget a request; one that did not finish is aborted and drained (when `alive`:
        TensorRT-LLM still runs). Runs in finally blocks, so it never raises."""
        self.results.pop(request_id, None)
        if finished or not alive or not _try_abort(request_id, result):
            return
        logger.debug("aborted request %s", request_id)
        try:
            task = asyncio.get_running_loop().create_task(_drain(result))
        except RuntimeError:  # loop gone (interpreter shutdown): nothing left to free
            return
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def wait_drained(self) -> None:
        if self._drains:
            await asyncio.wait(self._drains, timeout=STOP_WAIT_S)


async def _drain(result: Any) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in result:
                pass


def _try_abort(request_id: str, result: Any) -> bool:
    try:
        result.abort()
    except Exception as exc:
        logger.debug("abort of request %s failed: %r", request_id, exc)
        return False
    return True
