"""EngineCore: the built-in engine's step loop state, driven by messages
(engine/transport/messages).

The one core of the built-in engine. It runs wherever engine/transport/loop.py runs it (its own
process, or a thread of the gateway with --no-engine-process), never on the event loop:
admission (validation, in-flight ids, images, the seeded generator, the grammar's matcher), KV
import and export for disaggregation, the stream interval, and the health snapshot each batch
carries. Image encodes and grammar builds run on threads of their own (core_vision.py,
core_guided.py): a request waits outside the scheduler until they are done, so no step waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core_guided import GuidedWorker
from trtllm_gateway.engine.builtin.core_vision import VisionWorker
from trtllm_gateway.engine.builtin.kv_handoffs import KvHandoffs
from trtllm_gateway.engine.builtin.loader import LoadedModel, load
from trtllm_gateway.engine.builtin.outcomes import Emitted
from trtllm_gateway.engine.builtin.parts import EngineParts, assemble
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.sequence_builder import region_of_blob
from trtllm_gateway.engine.builtin.stepper import Stepper
from trtllm_gateway.engine.builtin.vision.embedder import create_embedder
from trtllm_gateway.engine.builtin.vision.placeholders import PlacedImage
from trtllm_gateway.engine.builtin.wakeup import Wakeup
from trtllm_gateway.engine.guided.matcher import RowMatcher
from trtllm_gateway.engine.kv_events.log import KvEventOutbox
from trtllm_gateway.engine.logits.load import args_of
from trtllm_gateway.engine.protocol import (
    EngineError,
    EngineHealth,
    EngineInfo,
    GenerateRequest,
    InvalidRequestError,
    TokenEvent,
    Usage,
)
from trtllm_gateway.engine.transport.image_body import images_from_body
from trtllm_gateway.engine.transport.messages import (
    Abort,
    Add,
    ExportKv,
    Inbound,
    OutputBatch,
    Ready,
    ReleaseKv,
    RenewKv,
    Reply,
    RequestError,
    Stop,
)
from trtllm_gateway.engine.transport.stream_interval import StreamInterval

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: BuiltinConfig) -> None:
        """config: what the launcher brought across (the engine's part only, no keys)."""
        self.config = config
        self.stopping = False
        self._interval = StreamInterval(config.engine.stream_interval)
        self._pending: Emitted = []
        self._parts: EngineParts | None = None
        self.loaded: LoadedModel | None = None
        self._vision: VisionWorker | None = None
        self._encoding: dict[str, tuple[Add, bytes | None]] = {}  # images being encoded
        self._guided: GuidedWorker | None = None
        self._constraining: dict[str, _Deferred] = {}  # grammars being built
        self._wakeup = Wakeup()  # set when an encode, a grammar build or a KV copy finished
        self._kv: KvHandoffs | None = None  # KV staged for siblings, and taken from them
        self.info = EngineInfo(model_id="", max_model_len=0, vocab_size=0, eos_token_ids=())
        # The prefix cache's events, forwarded with each batch to the client's own log.
        self.kv_events = KvEventOutbox()

    def load(self, progress: Callable[[str], None]) -> Ready:
        lm = self.loaded = load(self.config.engine, progress)
        if lm.vision is not None:
            embedder = create_embedder(lm.vision, self.config)
            self._vision = VisionWorker(embedder, lm.max_model_len, self._wakeup.set)
        parts = self._parts = assemble(lm, self.config, self.kv_events)
        timeout = self.config.engine.grammar_compile_timeout
        self._guided = GuidedWorker(parts.guided, timeout, self._wakeup.set)
        self.info = parts.info
        self._kv = KvHandoffs(lm, parts.stepper, self.config.engine, self._wakeup.set)
        arena = None
        if self.info.mode == "prefill":
            arena = self._kv.worker.host_arena()
            self._kv.worker.share_pool()
        self.info = replace(
            self.info,
            kv_arena=arena.name if arena is not None else "",
            kv_arena_token=arena.token.decode() if arena is not None else "",
            kv_cuda=lm.device.type == "cuda",
        )
        remote = self._remote_encode_outcomes() is not None
        return Ready(
            self.info, str(lm.model_dir or ""), self.health(), lm.blocks.num_blocks, remote
        )

    # --- messages ---------------------------------------------------------------------------
    @property
    def wake_fd(self) -> int | None:
        return self._wakeup.fd

    def handle(self, msg: Inbound, frames: list[bytes]) -> tuple[Reply, bytes | None] | None:
        """Apply one message; an ExportKv is answered at once (the reply and its blob)."""
        st = self._st
        if isinstance(msg, Add):
            kv = frames[0] if msg.first_token_ids and frames else None
            if msg.hold_kv:
                self._k.want_device(msg.request_id, msg.kv_device)
            req = GenerateRequest(
                msg.request_id, msg.prompt_token_ids, msg.sampling, trace_headers=msg.trace_headers
            )
            try:
                if msg.image_hashes:
                    self._encode(msg, req, kv, frames[-1] if frames else b"")
                else:
                    self._add(req, msg, kv)
            except EngineError as e:
                self._pending.append((msg.request_id, e))
        elif isinstance(msg, Abort):
            self._pending += self._k.abort(msg.request_id)
            self._pending += st.abort(msg.request_id)
            self._forget_encode(msg.request_id)
            self._forget_guided(msg.request_id)
        elif isinstance(msg, ExportKv):
            region = self._k.exported(msg.request_id)
            if region is None:
                text = f"no KV held for {msg.request_id!r} (expired or pulled)"
                return Reply(msg.cookie, RequestError("invalid", text)), None
            return Reply(msg.cookie, kv=region), None
        elif isinstance(msg, ReleaseKv):
            self._k.release(msg.request_id)
        elif isinstance(msg, RenewKv):
            self._k.renew(msg.request_id, time.perf_counter())
        elif isinstance(msg, Stop):
            self.stopping = True
            clock = st.pipeline.clock
            if clock.timed:
                logger.info("%s", clock.summary())
            self._pending += self._k.close()
            self._pending += st.abort_all()
            for request_id in list(self._encoding):
                self._forget_encode(request_id)
            for request_id in list(self._constraining):
                self._forget_guided(request_id)
            if self._vision is not None:
                self._vision.close()
            if self._guided is not None:
                self._guided.close()
            self._wakeup.close()  # the loop polls no more: it sends its last batch and ends
        return None

    def has_work(self) -> bool:
        """Work a step can make progress on now (a stalled queue waits for a message)."""
        st = self._st
        return st.scheduler.has_work() and not st.stalled

    def idle_timeout(self) -> float | None:
        """How long the loop may sleep with no work: held KV hand-offs and grammar builds
        expire."""
        waits = [1.0] if self._st.handoffs or self._k.holds() else []
        build = None if self._guided is None else self._guided.next_deadline()
        if build is not None:
            waits.append(build + 0.001)
        return min(waits, default=None)

    def step(self) -> None:
        """One engine step; its events wait in the batch. Raises only on an engine bug."""
        st = self._st
        self._wakeup.clear()
        if self._vision is not None:
            self._admit_encoded(self._vision)
        if self._guided is not None:
            self._admit_constrained(self._guided)
        kv = self._k
        self._pending += kv.collect(time.perf_counter())
        if st.handoffs:
            st.expire_handoffs(time.perf_counter())
        if st.scheduler.has_work():
            self._pending += kv.stage_finished(st.step())

    def batch(self) -> OutputBatch:
        """What to send now (after the stream interval), with the health after the step."""
        emitted, self._pending = self._interval(self._pending), []
        # Comprehensions, not a loop body an event: a step's 256 events went 35 -> 14 us (2-core
        # VM); most batches hold no error, and then the list goes out as it is.
        errors = [
            (rid, RequestError.of(ev)) for rid, ev in emitted if not isinstance(ev, TokenEvent)
        ]
        events = cast(list[tuple[str, TokenEvent]], emitted)
        if errors:
            events = [(rid, ev) for rid, ev in emitted if isinstance(ev, TokenEvent)]
        kv = self.kv_events.drain()
        return OutputBatch(events, errors, self.health(), kv, self._remote_encode_outcomes())

    def _remote_encode_outcomes(self) -> dict[str, int] | None:
        remote = None if self._vision is None else self._vision.embedder.remote
        return None if remote is None else dict(remote.stats.outcomes)

    def health(self) -> EngineHealth:
        if self._parts is None:
            return EngineHealth(state="loading")
        kv = self._kv
        handoffs = (0, 0.0) if kv is None else (kv.clock.count, kv.clock.seconds)
        return self._parts.health("draining" if self.stopping else "ready", handoffs=handoffs)

    @property
    def steps_on_cpu(self) -> bool:
        return self._st.device.type != "cuda"

    def cached_prefix_tokens(self, prompt_token_ids: tuple[int, ...]) -> int:
        """Read-only look at the prefix cache from the probe thread (may be a step stale)."""
        parts = self._parts
        if parts is None:
            return 0
        return parts.stepper.scheduler.cached_prefix_tokens(list(prompt_token_ids))

    # --- internals --------------------------------------------------------------------------
    @property
    def _p(self) -> EngineParts:
        assert self._parts is not None, "EngineCore.load() first"
        return self._parts

    @property
    def _st(self) -> Stepper:
        return self._p.stepper

    @property
    def _k(self) -> KvHandoffs:
        assert self._kv is not None, "EngineCore.load() first"
        return self._kv

    def _encode(self, msg: Add, req: GenerateRequest, kv: bytes | None, pixels: bytes) -> None:
        """Images: encode them off the loop; the request is admitted once they are embedded."""
        self._check_new(msg.request_id)
        if self._vision is None:
            raise InvalidRequestError("model does not accept images")
        images = images_from_body(pixels, msg.image_hashes)
        self._encoding[msg.request_id] = (msg, kv)
        self._vision.submit(msg.request_id, replace(req, images=images))

    def _admit_encoded(self, vision: VisionWorker) -> None:
        for request_id, result in vision.ready():
            entry = self._encoding.pop(request_id, None)
            if entry is None:
                continue  # aborted while its images were encoded
            msg, kv = entry
            try:
                if isinstance(result, BaseException):
                    if isinstance(result, EngineError):
                        raise result
                    raise InvalidRequestError(f"image encode failed: {result}")
                req, placed = result
                self._add(req, msg, kv, placed)
            except EngineError as e:
                self._pending.append((request_id, e))

    def _admit_constrained(self, guided: GuidedWorker) -> None:
        for request_id, built in guided.ready():
            entry = self._constraining.pop(request_id, None)
            if entry is None:
                continue  # aborted while its grammar was built
            try:
                if not isinstance(built, RowMatcher):
                    raise built
                self._add(entry.req, entry.msg, entry.kv, entry.placed, built)
            except EngineError as e:
                self._pending.append((request_id, e))

    def _check_new(self, request_id: str) -> None:
        st = self._st
        if (
            request_id in st.seqs
            or request_id in st.handoffs
            or request_id in self._encoding
            or request_id in self._constraining
            or self._k.busy(request_id)
        ):
            raise InvalidRequestError(f"request id {request_id!r} is already in flight")

    def _forget_encode(self, request_id: str) -> None:
        entry = self._encoding.pop(request_id, None)
        if entry is not None:
            usage = Usage(len(entry[0].prompt_token_ids), 0)
            self._pending.append((request_id, TokenEvent((), None, "abort", usage=usage)))

    def _forget_guided(self, request_id: str) -> None:
        entry = self._constraining.pop(request_id, None)
        if entry is not None:
            if self._guided is not None:
                self._guided.forget(request_id)
            usage = Usage(len(entry.msg.prompt_token_ids), 0)
            self._pending.append((request_id, TokenEvent((), None, "abort", usage=usage)))

    def _add(
        self,
        req: GenerateRequest,
        msg: Add,
        kv: bytes | None,
        placed: tuple[object, ...] = (),
        matcher: RowMatcher | None = None,
    ) -> None:
        guided = req.sampling.guided
        if guided is not None and matcher is None:
            matcher = self._p.guided.cached_matcher(guided)
        if guided is not None and matcher is None:
            # Its matcher is built off the step loop; the request is admitted when it is ready.
            self._check_new(msg.request_id)
            assert self._guided is not None
            self._constraining[msg.request_id] = _Deferred(req, msg, kv, placed)
            if self.stopping:  # an Add behind the Stop: the build threads are gone
                self._forget_guided(msg.request_id)
                return
            self._guided.submit(msg.request_id, guided)
            return
        seq, first = self._admit(req, msg, kv, matcher)
        if placed:
            seq.images = placed
            seq.mm_spans = tuple(
                (img.hash, p.start, p.end - p.start)
                for img, p in zip(req.images, placed, strict=True)
                if isinstance(p, PlacedImage)
            )
        if first is not None:  # decode side: admitted once its KV is in the reserved blocks
            self._k.load(seq, first, msg.kv_source, kv)
            return
        self._pending += self._st.add(seq, first)

    def _admit(
        self, req: GenerateRequest, msg: Add, kv_blob: bytes | None, matcher: RowMatcher | None
    ) -> tuple[Sequence, TokenEvent | None]:
        parts = self._p
        self._check_new(msg.request_id)  # an encoded request has left _encoding by now
        seq = parts.sequences.build(req)
        seq.hold_kv = msg.hold_kv
        if parts.logits:
            seq.logits_bound = parts.logits.bind(req.prompt_token_ids, args_of(req.sampling))
        seq.guided = matcher
        first = None
        if msg.first_token_ids:
            region = msg.kv_source
            if region is None and kv_blob is not None:  # an old sibling's kv_wire blob
                region, _ = region_of_blob(kv_blob)
            first = parts.sequences.import_first(
                seq, msg.first_token_ids, msg.first_logprobs, region
            )
        return seq, first


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A request waiting for its grammar's matcher: what _add needs to admit it then."""

    req: GenerateRequest
    msg: Add
    kv: bytes | None
    placed: tuple[object, ...]
