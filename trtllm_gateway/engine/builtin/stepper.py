"""Stepper: one engine step (schedule, forward, sample, stop checks) on the engine thread only."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from trtllm_gateway.engine.builtin.kv_transfer import export_kv, import_kv, slots_for
from trtllm_gateway.engine.builtin.overlap import OverlapPipeline
from trtllm_gateway.engine.builtin.sampler import Sampler, SampleResult, row_failure
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence, Status
from trtllm_gateway.engine.protocol import (
    EngineError,
    FinishReason,
    InvalidRequestError,
    Timings,
    TokenEvent,
    TokenLogprob,
    Usage,
)

if TYPE_CHECKING:
    from trtllm_gateway.engine.builtin.loader import LoadedModel

logger = logging.getLogger(__name__)

Emitted = list[tuple[str, TokenEvent | BaseException]]


class Stepper:
    def __init__(
        self, lm: LoadedModel, scheduler: Scheduler, sampler: Sampler, max_model_len: int
    ) -> None:
        self.runner = lm.runner
        self.device = lm.device
        self.scheduler = scheduler
        self.sampler = sampler
        self.max_model_len = max_model_len
        self.handoff_timeout = 30.0
        self.seqs: dict[str, Sequence] = {}
        # CUDA: schedule step N+1 while the GPU runs step N (overlap.py).
        self.pipeline = OverlapPipeline(self) if lm.runner.overlap else None
        # Prefill side: finished context phases whose KV blocks wait for a sibling to pull them.
        self.handoffs: dict[str, tuple[Sequence, float]] = {}
        self.kv_caches = lm.runner.kv_caches
        self.block_size = lm.blocks.block_size
        self.kv_layout = lm.kv_layout
        scheduler.on_import = self._write_imported

    def add(self, seq: Sequence, first: TokenEvent | None = None) -> Emitted:
        """Queue a sequence; a decode-side one arrives with its first token already sampled."""
        if first is not None:
            reason = self._finish_reason(seq, seq.token_ids[-1])
            if reason is not None:
                seq.status = Status.FINISHED
                return [
                    (
                        seq.request_id,
                        self._final_event(seq, reason, first.token_ids, first.logprobs),
                    )
                ]
        self.seqs[seq.request_id] = seq
        self.scheduler.add(seq)
        if first is None:
            return []
        seq.first_event_sent = True
        return [(seq.request_id, first)]

    def abort(self, request_id: str) -> Emitted:
        self.release_kv(request_id)
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return []
        if self.pipeline is not None:
            self.pipeline.forget(seq)
        self.scheduler.finish(seq)
        return [(request_id, self._final_event(seq, "abort", ()))]

    # --- disaggregation ---------------------------------------------------------------------
    def export_kv(self, request_id: str) -> bytes:
        """Serialize a held context phase's prompt KV and free its blocks (one pull only)."""
        entry = self.handoffs.pop(request_id, None)
        if entry is None:
            raise KeyError(request_id)
        seq = entry[0]
        try:
            slots = slots_for(seq.block_table, seq.prompt_len, self.block_size, self.device)
            return export_kv(self.kv_caches, slots, self.kv_layout, self.block_size)
        finally:
            self.scheduler.release(seq)

    def release_kv(self, request_id: str) -> None:
        entry = self.handoffs.pop(request_id, None)
        if entry is not None:
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
        if self.pipeline is not None:
            return self.pipeline.step()
        chunks = self.scheduler.schedule()
        if not chunks:
            return []
        out = self.runner.run(chunks)
        self.scheduler.commit(chunks)
        seqs = [c.seq for c in out.sample_chunks]
        try:
            results = self.sampler(out.logits, seqs) if seqs else []
        except Exception as e:  # contain it to the requests of this step, not the engine
            logger.exception("sampling failed; failing the %d requests of this step", len(seqs))
            return self.fail(seqs, InvalidRequestError(f"sampling failed: {e}"))
        now = time.perf_counter()
        events: Emitted = []
        for seq, r in zip(seqs, results, strict=True):
            if r.error is not None:
                events += self.fail([seq], row_failure(seq, f"sampling failed: {r.error}"))
                continue
            seq.token_ids.append(r.token_id)
            self.accept(seq, r, now, events)
        return events

    def fail(self, seqs: list[Sequence], error: EngineError) -> Emitted:
        for seq in seqs:
            self.seqs.pop(seq.request_id, None)
            self.scheduler.finish(seq)
        return [(seq.request_id, error) for seq in seqs]

    def accept(self, seq: Sequence, r: SampleResult, now: float, events: Emitted) -> None:
        """r's token is already the last of seq.token_ids: stop checks, then its event."""
        if seq.first_token is None:
            seq.first_token = now
        reason = self._finish_reason(seq, r.token_id)
        g = seq.guided
        if reason is None and g is not None:
            g.sync(seq.token_ids, seq.prompt_len)
            if g.error is not None:  # only a token the mask did not allow gets here
                events += self.fail([seq], row_failure(seq, f"constraint failed: {g.error}"))
                return
            if g.done:  # the grammar is complete: nothing but EOS could follow
                reason = "stop"
        lps = (r.logprob,) if r.logprob is not None else None
        if reason is not None:
            self.seqs.pop(seq.request_id, None)
            self.scheduler.finish(seq, keep_blocks=seq.hold_kv)
            if seq.hold_kv:
                self.handoffs[seq.request_id] = (seq, now + self.handoff_timeout)
            events.append((seq.request_id, self._final_event(seq, reason, (r.token_id,), lps)))
            return
        events.append((seq.request_id, self._event(seq, (r.token_id,), lps)))

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        sp = seq.sampling
        if token in sp.stop_token_ids and seq.output_len >= sp.min_tokens:
            seq.stop_token_id = token
            return "stop"
        if not sp.ignore_eos and token in self.sampler.eos and seq.output_len >= sp.min_tokens:
            seq.stop_token_id = token
            return "stop"
        if seq.output_len >= sp.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _event(
        self, seq: Sequence, tokens: tuple[int, ...], lps: tuple[TokenLogprob, ...] | None
    ) -> TokenEvent:
        if seq.first_event_sent:
            return TokenEvent(tokens, lps)  # the per-token hot path: positional is cheapest
        seq.first_event_sent = True
        prompt_lps = None
        if seq.sampling.prompt_logprobs is not None:
            prompt_lps = tuple(seq.prompt_logprobs)
        return TokenEvent(tokens, lps, prompt_logprobs=prompt_lps)

    def _final_event(
        self,
        seq: Sequence,
        reason: FinishReason,
        tokens: tuple[int, ...],
        lps: tuple[TokenLogprob, ...] | None = None,
    ) -> TokenEvent:
        base = self._event(seq, tokens, lps)
        now = time.perf_counter()
        sched = seq.first_scheduled or now
        first = seq.first_token or now
        timings = Timings(
            queue_s=sched - seq.arrival, prefill_s=first - sched, decode_s=now - first
        )
        usage = Usage(seq.prompt_len, seq.output_len, seq.num_cached)
        return TokenEvent(
            base.token_ids,
            base.logprobs,
            finish_reason=reason,
            stop_token_id=seq.stop_token_id,
            usage=usage,
            timings=timings,
            prompt_logprobs=base.prompt_logprobs,
        )
