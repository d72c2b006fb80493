"""Stepper: the requests in flight on the engine thread: add, abort, hand-offs, and each step.

It owns the step's collaborators and hands them to the StepPipeline (pipeline.py), which never
sees the Stepper; what a sampled token means (stop checks, events) is the Outcomes' part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtllm_gateway.engine.builtin.kv_transfer import import_kv, slots_for
from trtllm_gateway.engine.builtin.outcomes import Emitted, Outcomes
from trtllm_gateway.engine.builtin.pipeline import StepPipeline
from trtllm_gateway.engine.builtin.sampler import Sampler
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence, Status
from trtllm_gateway.engine.protocol import InvalidRequestError, OverloadedError, TokenEvent

if TYPE_CHECKING:
    from trtllm_gateway.engine.builtin.loader import LoadedModel


class Stepper:
    def __init__(
        self,
        lm: LoadedModel,
        scheduler: Scheduler,
        sampler: Sampler,
        max_model_len: int,
        handoff_timeout: float = 30.0,
        max_held_blocks: int | None = None,
        depth: int | None = None,
    ) -> None:
        """depth: steps the host resolves behind the device (pipeline.py); None: the
        backend's own (0 on CPU, 1 on CUDA)."""
        self.device = lm.device
        self.scheduler = scheduler
        self.sampler = sampler
        self.outcomes = Outcomes(scheduler, sampler.eos, max_model_len, handoff_timeout)
        self.seqs = self.outcomes.seqs  # in flight, by request_id
        self.handoffs = self.outcomes.handoffs  # context phases held for a sibling's pull
        # Blocks that context phases may hold for siblings at once (held or still prefilling):
        # unbounded, unpulled hand-offs would starve every other request until they expire.
        self.max_held_blocks = lm.blocks.num_blocks if max_held_blocks is None else max_held_blocks
        # The last step scheduled nothing and emitted nothing: only a message (an add, an
        # abort, a release) or a hand-off's expiry can change that, so the loop waits for one.
        self.stalled = False
        depth = lm.backend.depth if depth is None else depth
        self.pipeline = StepPipeline(scheduler, lm.backend, sampler, self.outcomes, depth)
        self.kv_caches = lm.backend.kv_caches
        self.block_size = lm.blocks.block_size
        self.kv_layout = lm.kv_layout
        scheduler.on_import = self._write_imported

    def add(self, seq: Sequence, first: TokenEvent | None = None) -> Emitted:
        """Queue a sequence; a decode-side one arrives with its first token already sampled.

        Refused (its error is the one event): an id already running or holding KV for a
        sibling (a second hand-off under one id would orphan the first one's blocks), and a
        context phase past the bound on held KV (Overloaded: the decode side prefills locally).
        """
        self.stalled = False
        request_id = seq.request_id
        if request_id in self.seqs or request_id in self.handoffs:
            held = "holds KV for a sibling" if request_id in self.handoffs else "is in flight"
            return [(request_id, InvalidRequestError(f"request id {request_id!r} {held}"))]
        if seq.hold_kv and self._held_blocks() + self._prompt_blocks(seq) > self.max_held_blocks:
            return [(request_id, OverloadedError("KV held for siblings is at its bound"))]
        if first is not None:
            reason = self.outcomes.finish_reason(seq, seq.token_ids[-1])
            if reason is not None:
                seq.status = Status.FINISHED
                final = self.outcomes.final_event(seq, reason, first.token_ids, first.logprobs)
                return [(seq.request_id, final)]
        self.seqs[seq.request_id] = seq
        self.scheduler.add(seq)
        if first is None:
            return []
        seq.first_event_sent = True
        return [(seq.request_id, first)]

    def _prompt_blocks(self, seq: Sequence) -> int:
        return self.scheduler.blocks.blocks_needed(seq.prompt_len)

    def _held_blocks(self) -> int:
        """Blocks held for siblings, and those context phases in flight will hold."""
        held = sum(len(seq.block_table) for seq, _ in self.handoffs.values())
        return held + sum(self._prompt_blocks(s) for s in self.seqs.values() if s.hold_kv)

    def abort(self, request_id: str) -> Emitted:
        self.stalled = False  # the request it frees may be what the queue waits for
        self.release_kv(request_id)
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return []
        self.pipeline.forget(seq)
        self.scheduler.finish(seq)
        return [(request_id, self.outcomes.final_event(seq, "abort", ()))]

    # --- disaggregation ---------------------------------------------------------------------
    def export_kv(self, request_id: str) -> Sequence:
        """Hand a held context phase over to the KV transfer worker, which stages its blocks
        (engine/builtin/kv_handoffs.py); they stay allocated until release_blocks."""
        entry = self.handoffs.pop(request_id, None)
        if entry is None:
            raise KeyError(request_id)
        return entry[0]

    def release_blocks(self, seq: Sequence) -> None:
        self.stalled = False
        self.scheduler.release(seq)

    def release_kv(self, request_id: str) -> None:
        entry = self.handoffs.pop(request_id, None)
        if entry is not None:
            self.stalled = False
            self.scheduler.release(entry[0])

    def expire_handoffs(self, now: float) -> None:
        for request_id, (_, deadline) in list(self.handoffs.items()):
            if deadline <= now:
                self.release_kv(request_id)

    def _write_imported(self, seq: Sequence) -> None:
        assert seq.kv_import is not None
        slots = slots_for(seq.block_table, seq.prompt_len, self.block_size, self.device)
        import_kv(self.kv_caches, slots, seq.kv_import)

    def abort_all(self) -> Emitted:
        out: Emitted = []
        for request_id in list(self.handoffs):
            self.release_kv(request_id)
        for request_id in list(self.seqs):
            out += self.abort(request_id)
        return out

    def step(self) -> Emitted:
        events = self.pipeline.step()
        idle = self.pipeline.inflight is None
        self.stalled = not events and self.scheduler.last_scheduled == 0 and idle
        return events
