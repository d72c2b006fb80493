"""Outcomes: what a sampled token means for its request: stop checks, its event, its end.

The step pipeline hands each resolved token here, at once (depth 0) or one step late (depth 1),
so the stop rules and the TokenEvents are written once; the pipeline needs this object, the
scheduler, the backend and the sampler, never the Stepper that owns it. A sequence that ends
leaves the scheduler; a context phase (hold_kv) keeps its blocks as a hand-off for a sibling.
"""

from __future__ import annotations

import time

from trtllm_gateway.engine.builtin.sampler import SampleResult, row_failure
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence, Status
from trtllm_gateway.engine.protocol import (
    EngineError,
    FinishReason,
    Timings,
    TokenEvent,
    TokenLogprob,
    Usage,
)

Emitted = list[tuple[str, TokenEvent | BaseException]]
FINISHED = Status.FINISHED


class Outcomes:
    def __init__(
        self,
        scheduler: Scheduler,
        eos: tuple[int, ...],
        max_model_len: int,
        handoff_timeout: float = 30.0,
    ) -> None:
        self.scheduler = scheduler
        self.eos = eos
        self.max_model_len = max_model_len
        self.handoff_timeout = handoff_timeout
        self.seqs: dict[str, Sequence] = {}  # in flight, by request_id
        # Prefill side: finished context phases whose KV blocks wait for a sibling to pull them.
        self.handoffs: dict[str, tuple[Sequence, float]] = {}

    def renew_handoff(self, request_id: str, now: float) -> None:
        """The decode side still waits for this hand-off: it expires a timeout from now."""
        entry = self.handoffs.get(request_id)
        if entry is not None:
            self.handoffs[request_id] = (entry[0], now + self.handoff_timeout)

    def fail(self, seqs: list[Sequence], error: EngineError) -> Emitted:
        for seq in seqs:
            self.seqs.pop(seq.request_id, None)
            self.scheduler.finish(seq)
        return [(seq.request_id, error) for seq in seqs]

    def accept_tokens(
        self, seqs: list[Sequence], tokens: list[int], now: float, events: Emitted
    ) -> None:
        """A step's tokens with no logprobs and no failed row, one per sequence: each replaces
        its sequence's placeholder, then accept(). A streaming row (most rows of most steps)
        that goes on takes the fast path: two checks and its event, no call."""
        append = events.append
        for seq, token in zip(seqs, tokens, strict=True):
            toks = seq.token_ids
            if seq.status is FINISHED or not toks or toks[-1] >= 0:
                continue  # stopped or aborted while its step ran
            toks[-1] = token
            if seq.streaming and len(toks) < seq.end_len and token not in seq.stop_ids:
                append((seq.request_id, TokenEvent((token,))))
                continue
            self.accept(seq, SampleResult(token, None), now, events)

    def accept(self, seq: Sequence, r: SampleResult, now: float, events: Emitted) -> None:
        """r's token is already the last of seq.token_ids: stop checks, then its event."""
        if seq.first_token is None:
            seq.first_token = now
        token = r.token_id
        reason = self.finish_reason(seq, token)
        if reason is None and seq.first_event_sent and seq.guided is None:
            # The per-token hot path (most rows of most steps): positional is cheapest.
            lp = r.logprob
            events.append((seq.request_id, TokenEvent((token,), None if lp is None else (lp,))))
            if seq.plain and not seq.streaming:
                self._stream(seq)
            return
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
                # Stepper.add refuses a second id; were one to get here, its blocks go back.
                old = self.handoffs.pop(seq.request_id, None)
                if old is not None:
                    self.scheduler.release(old[0])
                self.handoffs[seq.request_id] = (seq, now + self.handoff_timeout)
            events.append((seq.request_id, self.final_event(seq, reason, (r.token_id,), lps)))
            return
        events.append((seq.request_id, self.event(seq, (r.token_id,), lps)))

    def _stream(self, seq: Sequence) -> None:
        """accept_tokens' fast path for this row from now on: finish_reason folded into a set
        and a length (a plain row has min_tokens 0, so any stop id stops it)."""
        sp = seq.sampling
        stop = set(sp.stop_token_ids) if sp.ignore_eos else {*sp.stop_token_ids, *self.eos}
        seq.stop_ids = frozenset(stop)
        seq.end_len = min(seq.prompt_len + sp.max_tokens, self.max_model_len)
        seq.streaming = True

    def finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        sp = seq.sampling
        num_tokens = len(seq.token_ids)
        output_len = num_tokens - seq.prompt_len
        if (token in sp.stop_token_ids or (not sp.ignore_eos and token in self.eos)) and (
            output_len >= sp.min_tokens
        ):
            seq.stop_token_id = token
            return "stop"
        if output_len >= sp.max_tokens or num_tokens >= self.max_model_len:
            return "length"
        return None

    def event(
        self, seq: Sequence, tokens: tuple[int, ...], lps: tuple[TokenLogprob, ...] | None
    ) -> TokenEvent:
        if seq.first_event_sent:
            return TokenEvent(tokens, lps)  # the per-token hot path: positional is cheapest
        seq.first_event_sent = True
        prompt_lps = None
        if seq.sampling.prompt_logprobs is not None:
            prompt_lps = tuple(seq.prompt_logprobs)
        return TokenEvent(tokens, lps, prompt_logprobs=prompt_lps)

    def final_event(
        self,
        seq: Sequence,
        reason: FinishReason,
        tokens: tuple[int, ...],
        lps: tuple[TokenLogprob, ...] | None = None,
    ) -> TokenEvent:
        base = self.event(seq, tokens, lps)
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
