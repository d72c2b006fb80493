"""EngineCore: the built-in engine's step loop state, driven by messages (engine/core/messages).

It runs wherever engine/core/loop.py runs it (its own process, or a thread for tests), never on
the event loop: admission (validation, the seeded generator, the grammar's matcher), KV import and
export for disaggregation, the stream interval, and the health snapshot each batch carries. It
drives the same Stepper as BuiltinEngine, unchanged.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace

import torch

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin.core_vision import VisionWorker, images_from_frames
from trtllm_gateway.engine.builtin.kv_transfer import decode_kv
from trtllm_gateway.engine.builtin.loader import LoadedModel, load
from trtllm_gateway.engine.builtin.sampler import Sampler, check_token_ids
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.stepper import Emitted, Stepper
from trtllm_gateway.engine.builtin.stream_interval import StreamInterval
from trtllm_gateway.engine.builtin.vision.embedder import create_embedder
from trtllm_gateway.engine.core.messages import (
    Abort,
    Add,
    ExportKv,
    Inbound,
    OutputBatch,
    Ready,
    ReleaseKv,
    Reply,
    RequestError,
    Stop,
)
from trtllm_gateway.engine.guided.matcher import GuidedFactory
from trtllm_gateway.engine.kv_events import KvEventLog, event_json
from trtllm_gateway.engine.kv_wire import KvWireError
from trtllm_gateway.engine.model_source import model_display_name
from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    EngineError,
    EngineHealth,
    EngineInfo,
    GenerateRequest,
    InvalidRequestError,
    TokenEvent,
    Usage,
)

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stopping = False
        self._rng = random.Random(settings.seed)
        self._interval = StreamInterval(settings.stream_interval)
        self._pending: Emitted = []
        self._lm: LoadedModel | None = None
        self._stepper: Stepper | None = None
        self._guided: GuidedFactory | None = None
        self._vision: VisionWorker | None = None
        self._encoding: dict[str, tuple[Add, bytes | None]] = {}  # images being encoded
        self.info = EngineInfo(model_id="", max_model_len=0, vocab_size=0, eos_token_ids=())
        # The prefix cache's events, forwarded with each batch to the client's own log.
        self.kv_events = KvEventLog(settings.block_size, capacity=1 << 20)
        self._kv_sent = -1

    def load(self) -> Ready:
        s = self.settings
        lm = self._lm = load(s)
        self.kv_events.num_blocks = lm.blocks.num_blocks
        lm.blocks.events = self.kv_events
        lm.blocks.clear_cache()  # event 0: a reader starts from an empty cache
        if lm.vision is not None:
            embedder = create_embedder(lm.vision, s)
            self._vision = VisionWorker(embedder, lm.max_model_len)
        sched = Scheduler(lm.blocks, s.max_batch_size, s.max_num_tokens)
        st = self._stepper = Stepper(lm, sched, Sampler(lm.cfg.eos_token_ids), lm.max_model_len)
        st.handoff_timeout = s.kv_handoff_timeout
        self._guided = GuidedFactory(lm.model_dir, lm.cfg.vocab_size, lm.cfg.eos_token_ids)
        self.info = EngineInfo(
            model_id=s.served_model_name or model_display_name(s.model),
            max_model_len=lm.max_model_len,
            vocab_size=lm.cfg.vocab_size,
            eos_token_ids=lm.cfg.eos_token_ids,
            mode=s.mode,
            kv_layout=lm.kv_layout,
            supports_images=self._vision is not None,
            max_batch_size=s.max_batch_size,
        )
        remote = self._remote_encode_outcomes() is not None
        return Ready(
            self.info, str(lm.model_dir or ""), self.health(), lm.blocks.num_blocks, remote
        )

    # --- messages ---------------------------------------------------------------------------
    @property
    def wake_fd(self) -> int | None:
        return None if self._vision is None else self._vision.wake_fd

    def handle(self, msg: Inbound, frames: list[bytes]) -> tuple[Reply, bytes | None] | None:
        """Apply one message; an ExportKv is answered at once (the reply and its blob)."""
        st = self._st
        if isinstance(msg, Add):
            kv = frames[0] if msg.first_token_ids and frames else None
            req = GenerateRequest(msg.request_id, msg.prompt_token_ids, msg.sampling)
            try:
                if msg.image_hashes:
                    self._encode(msg, req, kv, frames[-1] if frames else b"")
                else:
                    self._add(req, msg, kv)
            except EngineError as e:
                self._pending.append((msg.request_id, e))
        elif isinstance(msg, Abort):
            self._pending += st.abort(msg.request_id)
            self._forget_encode(msg.request_id)
        elif isinstance(msg, ExportKv):
            try:
                return Reply(msg.cookie), st.export_kv(msg.request_id)
            except KeyError:
                text = f"no KV held for {msg.request_id!r} (expired or pulled)"
                return Reply(msg.cookie, RequestError("invalid", text)), None
        elif isinstance(msg, ReleaseKv):
            st.release_kv(msg.request_id)
        elif isinstance(msg, Stop):
            self.stopping = True
            self._pending += st.abort_all()
            for request_id in list(self._encoding):
                self._forget_encode(request_id)
            if self._vision is not None:
                self._vision.close()
        return None

    def has_work(self) -> bool:
        return self._st.scheduler.has_work()

    def idle_timeout(self) -> float | None:
        """How long the loop may sleep with no work: held KV hand-offs expire."""
        return 1.0 if self._st.handoffs else None

    def step(self) -> None:
        """One engine step; its events wait in the batch. Raises only on an engine bug."""
        st = self._st
        if self._vision is not None:
            self._admit_encoded(self._vision)
        if st.handoffs:
            st.expire_handoffs(time.perf_counter())
        if st.scheduler.has_work():
            self._pending += st.step()

    def batch(self) -> OutputBatch:
        """What to send now (after the stream interval), with the health after the step."""
        emitted, self._pending = self._interval(self._pending), []
        events: list[tuple[str, TokenEvent]] = []
        errors: list[tuple[str, RequestError]] = []
        for request_id, ev in emitted:
            if isinstance(ev, TokenEvent):
                events.append((request_id, ev))
            else:
                errors.append((request_id, RequestError.of(ev)))
        records, _ = self.kv_events.since(self._kv_sent)
        if records:
            self._kv_sent = records[-1].event_id
        kv = [event_json(r) for r in records]
        return OutputBatch(events, errors, self.health(), kv, self._remote_encode_outcomes())

    def _remote_encode_outcomes(self) -> dict[str, int] | None:
        remote = None if self._vision is None else self._vision.embedder.remote
        return None if remote is None else dict(remote.stats.outcomes)

    def health(self) -> EngineHealth:
        st = self._stepper
        if st is None:
            return EngineHealth(state="loading")
        s = st.scheduler
        return EngineHealth(
            state="draining" if self.stopping else "ready",
            running=len(s.running),
            waiting=len(s.waiting),
            kv_usage=s.blocks.usage,
            preemptions=s.preemptions,
            prefix_cache_queries=s.prefix_queries,
            prefix_cache_hits=s.prefix_hits,
        )

    def cached_prefix_tokens(self, prompt_token_ids: tuple[int, ...]) -> int:
        """Read-only look at the prefix cache from the probe thread (may be a step stale)."""
        st = self._stepper
        return 0 if st is None else st.scheduler.cached_prefix_tokens(list(prompt_token_ids))

    # --- internals --------------------------------------------------------------------------
    @property
    def _st(self) -> Stepper:
        assert self._stepper is not None, "EngineCore.load() first"
        return self._stepper

    def _encode(self, msg: Add, req: GenerateRequest, kv: bytes | None, pixels: bytes) -> None:
        """Images: encode them off the loop; the request is admitted once they are embedded."""
        if self._vision is None:
            raise InvalidRequestError("model does not accept images")
        if msg.request_id in self._st.seqs or msg.request_id in self._encoding:
            raise InvalidRequestError(f"request id {msg.request_id!r} is already in flight")
        images = images_from_frames(pixels, msg.image_hashes)
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

    def _forget_encode(self, request_id: str) -> None:
        entry = self._encoding.pop(request_id, None)
        if entry is not None:
            usage = Usage(len(entry[0].prompt_token_ids), 0)
            self._pending.append((request_id, TokenEvent((), None, "abort", usage=usage)))

    def _add(
        self, req: GenerateRequest, msg: Add, kv: bytes | None, placed: tuple[object, ...] = ()
    ) -> None:
        seq, first = self._admit(req, msg, kv)
        if placed:
            seq.images = placed
        self._pending += self._st.add(seq, first)

    def _admit(
        self, req: GenerateRequest, msg: Add, kv_blob: bytes | None
    ) -> tuple[Sequence, TokenEvent | None]:
        st = self._st
        info = self.info
        if msg.request_id in st.seqs:
            raise InvalidRequestError(f"request id {msg.request_id!r} is already in flight")
        n, sp = len(req.prompt_token_ids), req.sampling
        if n == 0:
            raise InvalidRequestError("the prompt is empty")
        if n + sp.max_tokens > info.max_model_len:
            raise ContextTooLongError(n, sp.max_tokens, info.max_model_len)
        check_token_ids(req, info.vocab_size)
        blocks = st.scheduler.blocks
        if blocks.blocks_needed(n + sp.max_tokens) > blocks.num_blocks:
            raise InvalidRequestError(
                f"prompt ({n}) plus max_tokens ({sp.max_tokens}) needs more KV cache than the "
                f"engine has ({blocks.num_blocks * blocks.block_size} tokens)"
            )
        seed = sp.seed if sp.seed is not None else self._rng.getrandbits(63)
        seq = Sequence.from_request(req, torch.Generator(device=st.device).manual_seed(seed))
        seq.hold_kv = msg.hold_kv
        if sp.guided is not None:
            assert self._guided is not None
            seq.guided = self._guided.cached_matcher(sp.guided) or self._guided.matcher(sp.guided)
        first = self._import(seq, msg, kv_blob) if msg.first_token_ids else None
        return seq, first

    def _import(self, seq: Sequence, msg: Add, blob: bytes | None) -> TokenEvent:
        """A decode-side request: the sibling's prompt KV and first token(s)."""
        if blob is None:
            raise InvalidRequestError("generation_only needs the sibling's KV and first token")
        if not all(0 <= t < self.info.vocab_size for t in msg.first_token_ids):
            raise InvalidRequestError("the sibling's first token ids are out of the vocabulary")
        try:
            num_tokens, kv = decode_kv(blob, self.info.kv_layout)
        except KvWireError as e:
            raise InvalidRequestError(f"remote prefill KV refused: {e}") from e
        if num_tokens != seq.prompt_len:
            raise InvalidRequestError(
                f"remote prefill KV covers {num_tokens} tokens, the prompt has {seq.prompt_len}"
            )
        seq.kv_import = kv
        seq.token_ids += msg.first_token_ids
        seq.first_token = time.perf_counter()
        return TokenEvent(msg.first_token_ids, msg.first_logprobs)
