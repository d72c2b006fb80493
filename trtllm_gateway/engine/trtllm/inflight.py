"""The TensorRT-LLM results in flight, by our request_id: abort, release, drain, and waking
them when the executor is gone.

TensorRT-LLM's GenerationResult.abort() calls its executor through a weakref that
LLM.shutdown() (or a dead worker) leaves empty, so an abort may raise at any time after that;
nothing here lets it escape. A result given up before it finished is aborted and read to its
end in the background, so TensorRT-LLM frees its KV cache and slot.

When the executor's worker ends (executor/worker.py worker_main, 1.2 window: it tells the
proxy's result threads to quit), the requests in flight get no further response: a read of one
would wait for ever. Every read goes through wait(), and fail_waiting() wakes those waiting
with EngineDeadError, so their streams end with an error frame rather than being cut when the
server exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from trtllm_gateway.engine.protocol import EngineDeadError

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0
STOP_WAIT_S = 5.0  # stop() waits this long for the drains
_GONE = "the TensorRT-LLM executor is gone"  # the cancellation fail_waiting sends
T = TypeVar("T")


class InFlight:
    """request_id -> TensorRT-LLM result, for the requests submitted and not yet released."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self._drains: set[asyncio.Task[None]] = set()
        self._waiting: dict[str, asyncio.Task[Any]] = {}  # reading a result now, by request
        self._gone: str | None = None  # why the executor is gone (fail_waiting)

    async def wait(self, request_id: str, pending: Awaitable[T]) -> T:
        """Await one read of a request's result (its next step, or the whole result); if the
        executor goes meanwhile, EngineDeadError instead of waiting for ever."""
        task = asyncio.current_task()
        assert task is not None
        if self._gone is not None:
            close = getattr(pending, "close", None)
            if close is not None:
                close()  # an __anext__ coroutine never awaited
            raise EngineDeadError(f"{_GONE}: {self._gone}")
        self._waiting[request_id] = task
        try:
            return await pending
        except asyncio.CancelledError as exc:
            if self._gone is None or exc.args != (_GONE,):
                raise  # the caller's own cancellation (a client gone)
            task.uncancel()
            raise EngineDeadError(f"{_GONE}: {self._gone}") from None
        finally:
            self._waiting.pop(request_id, None)

    def fail_waiting(self, why: str) -> None:
        """The executor is gone: wake every read waiting on it (see wait) and refuse later ones.
        Runs on the event loop (the engine marks itself dead there)."""
        self._gone = why
        for task in list(self._waiting.values()):
            task.cancel(_GONE)

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
