"""VisionWorker: the engine core's image encodes, off its step loop.

The ImageEmbedder (its cache, an encode sibling over HTTP, the local encoder) is async; in the
core process it runs on an event loop of its own thread. A finished encode is queued and the
core's Wakeup set, so the step loop never waits for an encode and wakes as soon as one is
ready. Pixels arrive as embed_wire "pixels" frames (engine/transport/image_body.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

from trtllm_gateway.engine.builtin.vision.embedder import ImageEmbedder
from trtllm_gateway.engine.builtin.vision.placeholders import PlacedImage
from trtllm_gateway.engine.protocol import GenerateRequest

Prepared = tuple[GenerateRequest, tuple[PlacedImage, ...]]


class VisionWorker:
    def __init__(
        self, embedder: ImageEmbedder, max_model_len: int, wake: Callable[[], None]
    ) -> None:
        self.embedder = embedder
        self.max_model_len = max_model_len
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vision", daemon=True)
        self._thread.start()
        self._done: queue.SimpleQueue[tuple[str, Prepared | BaseException]] = queue.SimpleQueue()
        self._wake = wake

    def submit(self, request_id: str, req: GenerateRequest) -> None:
        coro = self.embedder.prepare(req, self.max_model_len)
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)

        def done(f: Future[Prepared]) -> None:
            exc = f.exception()
            self._done.put((request_id, exc if exc is not None else f.result()))
            self._wake()

        fut.add_done_callback(done)

    def ready(self) -> list[tuple[str, Prepared | BaseException]]:
        """Encodes finished since the last call (any order)."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.embedder.aclose(), self.loop).result(5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
