"""BuiltinEngine: the asyncio front of the PyTorch engine; the step loop runs in its own thread.

Requests and aborts reach the thread through an inbox; token events come back to per-request
asyncio.Queues, one call_soon_threadsafe per step for the whole batch. Its EngineParts (stepper,
admission, info) are assembled as EngineCore's are (parts.py); only what a thread front does
differently (images and grammars prepared off the event loop) is its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin.config import EngineConfig
from trtllm_gateway.engine.builtin.front import follow, prefill_result
from trtllm_gateway.engine.builtin.loader import LoadedModel, load
from trtllm_gateway.engine.builtin.parts import EngineParts, assemble
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.stepper import Stepper
from trtllm_gateway.engine.builtin.stream_interval import Event, StreamInterval
from trtllm_gateway.engine.builtin.vision.embedder import ImageEmbedder, create_embedder
from trtllm_gateway.engine.kv_events.log import KvEventLog
from trtllm_gateway.engine.protocol import (
    EngineDeadError,
    EngineExtras,
    EngineHealth,
    EngineInfo,
    EngineState,
    GenerateRequest,
    InvalidRequestError,
    OverloadedError,
    PrefillResult,
    TokenEvent,
)

logger = logging.getLogger(__name__)

_Event = Event


class BuiltinEngine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config = EngineConfig.from_settings(settings)
        self.info = EngineInfo(
            model_id=self.config.model_id, max_model_len=0, vocab_size=0, eos_token_ids=()
        )
        self.tokenizer_dir: Any = None
        self._state: EngineState = "loading"
        self._detail = ""
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._queues: dict[str, asyncio.Queue[_Event]] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loaded: LoadedModel | None = None
        self._parts: EngineParts | None = None
        self._stepper: Stepper | None = None
        self._vision: ImageEmbedder | None = None
        self._interval = StreamInterval(self.config.stream_interval)
        self.kv_event_log = KvEventLog(self.config.block_size)  # KvEventSource: the prefix cache's

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        loaded: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._main, args=(loaded,), name="builtin-engine", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.wrap_future(loaded)
        except Exception as e:
            self._state, self._detail = "dead", f"model failed to load: {e}"
            raise
        lm = self._loaded
        assert lm is not None and self._parts is not None
        self.tokenizer_dir = lm.model_dir
        self._vision = create_embedder(lm.vision, self.config.load) if lm.vision else None
        self.info = self._parts.info
        self._state = "ready"

    async def stop(self) -> None:
        if self._state != "dead":
            self._state = "draining"
        self._inbox.put(("stop", None))
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self._vision is not None:
            await self._vision.aclose()
        self._state = "dead" if self._detail else "draining"

    def health(self) -> EngineHealth:
        if self._parts is None:
            return EngineHealth(state=self._state, detail=self._detail)
        return self._parts.health(self._state, self._detail)

    # --- requests -------------------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        seq = await self._admit_async(req)
        first = None
        if req.disagg is not None and req.disagg.request_type == "generation_only":
            first = self._prepare_import(seq, req)
        async for ev in self._stream(seq, first):
            yield ev

    async def prefill(self, req: GenerateRequest) -> PrefillResult:
        """Context phase only: sample the first token, keep the prompt's KV for a sibling."""
        req = replace(req, sampling=replace(req.sampling, max_tokens=1))
        seq = await self._admit_async(req)
        seq.hold_kv = True
        events = [ev async for ev in self._stream(seq, None)]
        return prefill_result(req.request_id, events, self.info.kv_layout)

    async def pull_kv(self, ctx_request_id: str) -> bytes:
        """The prompt KV of a finished context phase, as a kv_wire blob; frees its blocks."""
        assert self._loop is not None
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._submit("export", (ctx_request_id, fut))
        return await fut

    def release_kv(self, ctx_request_id: str) -> None:
        """Free a context phase's held blocks without pulling them (idempotent)."""
        self._submit("release", ctx_request_id)

    @property
    def extras(self) -> EngineExtras:
        return EngineExtras(self.tokenizer_dir, remote_encode=self.remote_encode_outcomes)

    @property
    def remote_encode_outcomes(self) -> Counter[str] | None:
        """Remote-encode outcomes for /metrics, when --encode-url is set on a vision model."""
        if self._vision is None or self._vision.remote is None:
            return None
        return self._vision.remote.stats.outcomes

    def cached_prefix_tokens(self, prompt_token_ids: tuple[int, ...]) -> int:
        """A read-only look at the prefix cache from the event loop (may be a step stale)."""
        st = self._stepper
        if st is None:
            return 0
        return st.scheduler.cached_prefix_tokens(list(prompt_token_ids))

    def _prepare_import(self, seq: Sequence, req: GenerateRequest) -> TokenEvent:
        d = req.disagg
        assert d is not None and self._parts is not None
        blob = d.kv_payload if isinstance(d.kv_payload, bytes) else None
        return self._parts.admission.import_first(seq, d.first_token_ids, d.first_logprobs, blob)

    async def _stream(self, seq: Sequence, first: TokenEvent | None) -> AsyncIterator[TokenEvent]:
        q: asyncio.Queue[_Event] = asyncio.Queue()
        self._queues[seq.request_id] = q
        self._submit("add", (seq, first))
        # Closed with this generator, so an abort is sent at once, not when it is collected.
        async with contextlib.aclosing(follow(self._queues, seq.request_id, self.abort)) as events:
            async for item in events:
                yield item

    def abort(self, request_id: str) -> None:
        self._submit("abort", request_id)

    # --- internals ------------------------------------------------------------------------
    def _admit(self, req: GenerateRequest) -> Sequence:
        if self._state == "loading":
            raise OverloadedError("the model is still loading")
        if self._state != "ready" or self._parts is None:
            raise EngineDeadError(self._detail or "the engine is not serving")
        # An empty prompt gets Admission's own refusal, whatever else is wrong with it.
        if req.prompt_token_ids and req.request_id in self._queues:
            raise InvalidRequestError(f"request id {req.request_id!r} is already in flight")
        if req.prompt_token_ids and req.images and not self.info.supports_images:
            raise InvalidRequestError("model does not accept images")
        return self._parts.admission.sequence(req)

    async def _admit_async(self, req: GenerateRequest) -> Sequence:
        """_admit, then the slow parts off the event loop: images, the grammar's matcher."""
        seq = await self._admit_images(req) if req.images else self._admit(req)
        guided = req.sampling.guided
        if guided is not None:
            assert self._parts is not None
            matchers = self._parts.guided
            # A constraint seen before is copied here, so a burst of such requests reaches the
            # engine together (a thread hop each would stagger them into separate prefills).
            seq.guided = matchers.cached_matcher(guided) or await asyncio.to_thread(
                matchers.matcher, guided
            )
        return seq

    async def _admit_images(self, req: GenerateRequest) -> Sequence:
        """_admit after embedding the images and expanding each image token to its rows."""
        if self._vision is None:
            return self._admit(req)  # refuses: loading, or a model without images
        req, placed = await self._vision.prepare(req, self.info.max_model_len)
        seq = self._admit(req)
        seq.images = placed
        return seq

    def _submit(self, kind: str, payload: Any) -> None:
        self._inbox.put((kind, payload))
        self._wake.set()

    def _dispatch(self, events: list[tuple[str, _Event]]) -> None:
        for request_id, ev in events:
            q = self._queues.get(request_id)
            if q is not None:
                q.put_nowait(ev)

    def _emit(self, events: list[tuple[str, _Event]]) -> None:
        events = self._interval(events)
        if events and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch, events)

    def _export(self, st: Stepper, ctx_request_id: str, fut: asyncio.Future[bytes]) -> None:
        def settle(result: bytes | BaseException) -> None:
            if fut.done():
                return
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)

        try:
            blob: bytes | BaseException = st.export_kv(ctx_request_id)
        except KeyError:
            blob = InvalidRequestError(f"no KV held for {ctx_request_id!r} (expired or pulled)")
        assert self._loop is not None
        self._loop.call_soon_threadsafe(settle, blob)

    def _main(self, loaded: concurrent.futures.Future[None]) -> None:
        """Load, then step, in this one thread. torch's OpenMP threads belong to the thread that
        runs a parallel region; a model loaded in another thread leaves a second set of them,
        and with more OpenMP threads than cores libgomp stops spin-waiting between regions:
        every parallel op then waits to wake its threads (a CPU decode step took 1.3-2x as
        long, bench.cpu_step)."""
        try:
            self._loaded = load(self.config.load)
            self._parts = assemble(self._loaded, self.config, self.kv_event_log)
            self._stepper = self._parts.stepper
        except BaseException as e:
            loaded.set_exception(e)
            return
        loaded.set_result(None)
        self._run()

    def _run(self) -> None:
        st = self._stepper
        assert st is not None
        stopping = False
        # Hand the GIL to the event loop between steps on CPU only. A CPU step is hundreds of
        # eager ops that each drop and retake the GIL; letting the loop render its chunks here,
        # in one go, keeps it from retaking the GIL mid-step (served tok/s at concurrency 8:
        # 40-49 with the yield, 35 without). A CUDA step drops the GIL only while it waits on
        # the GPU, which is when the loop should run: there the yield cost 7-34% of offline and
        # ~20% of served throughput (H100, 135M, 256 streams).
        yield_gil = st.device.type != "cuda"
        while True:
            events: list[tuple[str, _Event]] = []
            while True:
                try:
                    kind, payload = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if kind == "add":
                    events += st.add(*payload)
                elif kind == "abort":
                    events += st.abort(payload)
                elif kind == "export":
                    self._export(st, *payload)
                elif kind == "release":
                    st.release_kv(payload)
                elif kind == "stop":
                    stopping = True
            if stopping:
                self._emit(events + st.abort_all())
                return
            if st.handoffs:
                st.expire_handoffs(time.perf_counter())
            if not st.scheduler.has_work() or st.stalled:
                self._emit(events)
                # Nothing a step can progress on (a queue waiting for blocks only a message or
                # an expiry frees): wait, at least every second while KV handoffs may expire.
                self._wake.wait(timeout=1.0 if st.handoffs else None)
                self._wake.clear()
                continue
            try:
                events += st.step()
            except Exception as e:  # an engine bug: fail every request, mark dead
                logger.exception("engine step failed")
                self._state, self._detail = "dead", f"engine step failed: {e}"
                err = EngineDeadError(self._detail)
                self._emit(events + [(rid, err) for rid in list(self._queues)])
                return
            self._emit(events)
            if yield_gil:
                time.sleep(0)
