"""KvHandoffs: the core's KV hand-offs with siblings, both ends, driven from its step thread.

    prefill side: a context phase ends ─▶ its final event is held, its blocks staged by the
                  transfer worker ─▶ Staged: blocks freed, the event sent, the region kept for
                  the sibling until a ReleaseKv (or its lease ends)
                  (GPU sibling, paged: the event goes at once with the blocks' ids in the
                  shared pool; the blocks stay held, as context phases are, until the
                  ReleaseKv or the lease's end)
    decode side:  an Add with a sibling's region ─▶ blocks reserved (in arrival order, as they
                  free) ─▶ the worker copies into them ─▶ Loaded: the sequence is admitted

The copies run on KvTransferWorker's thread; here is only bookkeeping (dicts and a block count).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin.backend import KvCaches
from trtllm_gateway.engine.builtin.kv_transfer_worker import KvTransferWorker, Staged
from trtllm_gateway.engine.builtin.loader import LoadedModel
from trtllm_gateway.engine.builtin.outcomes import Emitted
from trtllm_gateway.engine.builtin.sequence import Sequence, Status
from trtllm_gateway.engine.builtin.sequence_builder import region_of_blob
from trtllm_gateway.engine.builtin.stepper import Stepper
from trtllm_gateway.engine.kv_region import KvRegion, arena_bytes
from trtllm_gateway.engine.protocol import (
    InvalidRequestError,
    OverloadedError,
    RequestFailedError,
    TokenEvent,
)


@dataclass(slots=True)
class _Incoming:
    seq: Sequence
    first: TokenEvent
    region: KvRegion
    payload: bytes | memoryview | None


logger = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(slots=True)
class HandoffClock:
    """Hand-offs begun here (staged for a decode sibling, or loaded from a prefill sibling) and
    the step thread's seconds on every hand-off call: seconds / count is the step thread's cost
    a hand-off inside a serving core (issue 41's < 0.1 ms), exported as the kv_handoffs and
    kv_handoff_step_seconds counters. Charged whole: a decode-side admission's st.add too."""

    count: int = 0
    seconds: float = 0.0
    by_call: dict[str, float] = field(default_factory=dict)  # seconds by call, for the log
    longest: dict[str, float] = field(default_factory=dict)  # the longest call of each, the log
    # The thread's CPU seconds by call: where a call's wall time is far above them, the thread
    # waited (for the GIL, or the OS) rather than worked. In serving cores on two H200
    # (2026-11-29) every kind's CPU time matched its wall time: the prefill side's release,
    # 76-84 us for the prompt's 129 blocks (8 us in a micro-benchmark with its data in cache, 32
    # after a 64 MB sweep), is work in a process whose caches the step had just evicted.
    cpu_by_call: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)  # calls by kind: a cost a hand-off
    # that is many cheap calls (a collect at every loop wake) reads apart from one costly call

    def since(self, t0: float, call: str, c0: float) -> None:
        spent = time.perf_counter() - t0
        self.seconds += spent
        self.by_call[call] = self.by_call.get(call, 0.0) + spent
        if spent > self.longest.get(call, 0.0):
            self.longest[call] = spent
        cpu = time.thread_time() - c0
        self.cpu_by_call[call] = self.cpu_by_call.get(call, 0.0) + cpu
        self.calls[call] = self.calls.get(call, 0) + 1

    def timed(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            self.since(t0, fn.__name__.lstrip("_"), c0)

    def summary(self) -> str:
        """Microseconds a hand-off in all and by call (logged when the core stops), and each
        kind's longest call: a one-time cost (a first IPC handle) shows there, not in a mean."""
        per = {k: round(v / self.count * 1e6, 1) for k, v in sorted(self.by_call.items())}
        top = {k: round(v * 1e6, 1) for k, v in sorted(self.longest.items())}
        cpu = {k: round(v / self.count * 1e6, 1) for k, v in sorted(self.cpu_by_call.items())}
        calls = {k: round(v / self.count, 1) for k, v in sorted(self.calls.items())}
        total = self.seconds / self.count * 1e6
        return (
            f"{self.count} KV hand-offs, the step thread {total:.1f} us each: {per}; "
            f"the longest call of each kind (us): {top}; its CPU time by call (us): {cpu}; "
            f"calls a hand-off: {calls}"
        )


EXPIRY_CHECK_S = 0.05


class KvHandoffs:
    def __init__(
        self, lm: LoadedModel, stepper: Stepper, engine: EngineConfig, wake: Callable[[], None]
    ) -> None:
        self.st = stepper
        self.blocks = lm.blocks
        caches = lm.backend.kv_caches
        self.worker = KvTransferWorker(
            caches,
            lm.blocks.block_size,
            lm.device,
            lm.kv_layout,
            arena_bytes(engine.kv_staging_mb, _token_bytes(caches), lm.max_model_len),
            engine.kv_handoff_timeout,
            wake,
        )
        self.staged: dict[str, KvRegion] = {}  # prefill side: waiting for the sibling
        self._device: set[str] = set()  # hold_kv requests whose sibling takes the GPU arena
        self._staging: dict[str, tuple[Sequence, TokenEvent]] = {}
        self._loading: dict[str, tuple[Sequence, TokenEvent]] = {}
        self._waiting: deque[_Incoming] = deque()  # decode side: no room to reserve yet
        self._aborted: set[str] = set()
        self._paged: set[str] = set()  # staged regions that are the held blocks themselves
        self._next_expiry = 0.0  # when collect() next looks for leases that ran out
        self.clock = HandoffClock()

    # --- prefill side -----------------------------------------------------------------------
    def want_device(self, request_id: str, device: bool) -> None:
        if device:
            self._device.add(request_id)

    def stage_finished(self, events: Emitted) -> Emitted:
        """A step's events, less the final events of context phases now being staged."""
        if not self.st.handoffs:
            return events  # no context phase held: nothing of this step to stage
        return self.clock.timed(self._stage, events)

    def _stage(self, events: Emitted) -> Emitted:
        out: Emitted = []
        for request_id, ev in events:
            final = isinstance(ev, TokenEvent) and ev.finish_reason is not None
            if not final or request_id not in self.st.handoffs:
                out.append((request_id, ev))
                continue
            assert isinstance(ev, TokenEvent)
            device = request_id in self._device
            self._device.discard(request_id)
            if device:  # the blocks stay held in st.handoffs, under its lease
                held = self.st.handoffs[request_id][0]
                paged = self.worker.pool_region(held.block_table, held.prompt_len)
                if paged is not None:
                    self.staged[request_id] = paged
                    self._paged.add(request_id)
                    self.clock.count += 1
                    out.append((request_id, ev))
                    continue
            self.clock.count += 1
            seq = self.st.export_kv(request_id)
            why = self.worker.stage(request_id, seq.block_table, seq.prompt_len, device)
            if why:
                self.st.release_blocks(seq)
                out.append((request_id, OverloadedError(why)))
                continue
            self._staging[request_id] = (seq, ev)
        return out

    def release(self, request_id: str) -> None:
        """The sibling took the KV or gave up: free its region (or its still-held blocks)."""
        self.clock.timed(self._release, request_id)

    def _release(self, request_id: str) -> None:
        if request_id in self._staging:
            self._aborted.add(request_id)
        elif self.worker.free(request_id):
            self.staged.pop(request_id, None)
        else:  # held blocks: a context phase not staged yet, or a paged region's
            self.staged.pop(request_id, None)
            self._paged.discard(request_id)
            self.st.release_kv(request_id)

    def exported(self, request_id: str) -> KvRegion | None:
        """The region held for the sibling (None: expired, released, or never staged)."""
        return self.clock.timed(self._exported, request_id)

    def _exported(self, request_id: str) -> KvRegion | None:
        region = self.staged.get(request_id)
        if region is not None and region.blocks and request_id not in self.st.handoffs:
            del self.staged[request_id]  # a paged region whose blocks went back
            self._paged.discard(request_id)
            return None
        return region

    def renew(self, request_id: str, now: float) -> None:
        """The decode side still waits (a lease renewal): the staged region, or the blocks
        still held before staging, expire a full lease from now."""
        t0, c0 = time.perf_counter(), time.thread_time()
        if not self.worker.renew(request_id, now):
            self.st.outcomes.renew_handoff(request_id, now)
        self.clock.since(t0, "renew", c0)

    # --- decode side ------------------------------------------------------------------------
    def load(
        self,
        seq: Sequence,
        first: TokenEvent,
        region: KvRegion | None,
        frame: bytes | None,
    ) -> None:
        """Admit seq once the sibling's KV is in blocks reserved for it (Admission checked
        the region against the prompt)."""
        self.clock.count += 1
        self.clock.timed(self._incoming, seq, first, region, frame)

    def _incoming(
        self, seq: Sequence, first: TokenEvent, region: KvRegion | None, frame: bytes | None
    ) -> None:
        payload: bytes | memoryview | None = None
        if region is None:
            if frame is None:
                raise InvalidRequestError("generation_only needs the sibling's KV")
            region, payload = region_of_blob(frame)
        elif region.transport == "frame":
            if frame is None:
                raise InvalidRequestError("the sibling's KV frame is missing")
            payload = frame
        self._waiting.append(_Incoming(seq, first, region, payload))
        self._reserve()

    def _reserve(self) -> None:
        """Blocks for the waiting imports, first come first served, then their copies."""
        while self._waiting:
            inc = self._waiting[0]
            need = self.blocks.blocks_needed(inc.seq.num_tokens)
            if not self.blocks.can_allocate(need):
                return
            self._waiting.popleft()
            seq = inc.seq
            seq.block_table = self.blocks.allocate(need)
            self._loading[seq.request_id] = (seq, inc.first)
            self.worker.load(seq.request_id, inc.region, inc.payload, seq.block_table)

    # --- both -------------------------------------------------------------------------------
    def collect(self, now: float) -> Emitted:
        """What the worker finished: staged events sent, loaded sequences admitted."""
        if not self.holds():
            return self._collect(now)  # nothing in hand: no hand-off's cost
        return self.clock.timed(self._collect, now)

    def _collect(self, now: float) -> Emitted:
        out: Emitted = []
        for done in self.worker.done():
            request_id = done.request_id
            aborted = request_id in self._aborted
            self._aborted.discard(request_id)
            if isinstance(done, Staged):
                seq, ev = self._staging.pop(request_id)
                self.st.release_blocks(seq)
                if done.region is None:
                    out.append((request_id, RequestFailedError(done.error)))
                elif aborted:
                    self.worker.free(request_id)
                else:
                    self.staged[request_id] = done.region
                    out.append((request_id, ev))
                continue
            seq, first = self._loading.pop(request_id)
            if aborted or done.error:
                self._free(seq)
                if aborted:
                    out.append((request_id, self.st.outcomes.final_event(seq, "abort", ())))
                else:
                    out.append((request_id, InvalidRequestError(done.error)))
                continue
            seq.kv_loaded = True
            out += self.st.add(seq, first)
            if request_id not in self.st.seqs:  # refused, or finished on its first token
                self._free(seq)
        if now >= self._next_expiry:  # leases run for seconds: a look every 50 ms will do
            self._next_expiry = now + EXPIRY_CHECK_S
            for request_id in self.worker.expire(now):
                self.staged.pop(request_id, None)
        if self._paged:  # paged regions whose blocks went back (their lease ran out, an abort)
            for request_id in self._paged - self.st.handoffs.keys():
                self._exported(request_id)
        if self._waiting:
            self._reserve()
        return out

    def abort(self, request_id: str) -> Emitted:
        self._device.discard(request_id)
        if request_id in self._loading or request_id in self._staging:
            self._aborted.add(request_id)  # freed when the worker is done with its blocks
            return []
        for inc in self._waiting:
            if inc.seq.request_id == request_id:
                self._waiting.remove(inc)
                return [(request_id, self.st.outcomes.final_event(inc.seq, "abort", ()))]
        return []

    def busy(self, request_id: str) -> bool:
        """The id names a hand-off here: staging, staged for a sibling (a second context phase
        under it would orphan the first's region: issue 24's duplicate id), or loading."""
        return (
            request_id in self._loading
            or request_id in self._staging
            or request_id in self.staged
            or any(inc.seq.request_id == request_id for inc in self._waiting)
        )

    def holds(self) -> bool:
        """Something may change without a message: a lease to expire, a copy to finish."""
        return bool(self.staged or self._staging or self._loading or self._waiting)

    def close(self) -> Emitted:
        """Stop: let the worker finish its copies, then free what they held."""
        out: Emitted = []
        for inc in list(self._waiting):
            out += self.abort(inc.seq.request_id)
        self._aborted |= set(self._loading) | set(self._staging)
        self.worker.close()
        out += self.collect(0.0)
        self.staged.clear()
        self._paged.clear()
        if self.clock.count:
            logger.info("%s", self.clock.summary())
        return out

    def _free(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.status = Status.FINISHED
        self.st.stalled = False


def _token_bytes(caches: KvCaches) -> int:
    k = caches[0][0]
    return 2 * len(caches) * k[0].numel() * k.element_size()
