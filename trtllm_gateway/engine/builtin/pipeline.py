"""StepPipeline: one engine step on every device: launch step N, then resolve the step `depth` back.

  schedule ─▶ StepBatch.build ─▶ backend.forward ─▶ sampler.sample ─▶ PendingSample   (launch)
                                    (a decode graph may sample inside itself: sampler.Draws)
  resolve the step `depth` back: PendingSample.resolve ─▶ Outcomes (stop checks, events)
  commit (the scheduler: progress, full blocks to the prefix cache) ─▶ placeholders

A steady step (every running sequence decoding, as in the step before: Scheduler.
schedule_decodes) takes the same stages from arrays: StepBatch.of_decodes, commit_decodes.

depth 0 (CPU's default): a step is resolved as soon as it is launched. depth 1 (CUDA's): once step
N is launched, each sampling sequence gets a placeholder token -(r + 1), r its row in step N's
sampled ids, which stay on the device. The scheduler only counts tokens, so step N+1 is
scheduled and launched at once, the backend swapping the placeholders for the real ids on the
device; only then does the host wait for step N's ids (copied by then) and run the stop checks.
A sequence that stopped at step N has one wasted token computed in step N+1, whose result is
dropped. Rows that read the token history (penalties, logits processors, a grammar's mask)
resolve the step in flight first. At depth 0 a placeholder never outlives step().

One failure rule (step_failure.py): a launch or a resolve that raises fails the requests of its
step, nothing of the launch committed; an error that says the device is broken ends the core.
A row the sampler could not sample fails that request alone (row_failure).

The pipeline is given its collaborators (scheduler, backend, sampler, and the Outcomes that turn
a resolved token into its event), never the Stepper that owns it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from trtllm_gateway.engine.builtin.backend import Backend
from trtllm_gateway.engine.builtin.decode_tables import DecodeTables
from trtllm_gateway.engine.builtin.outcomes import Emitted, Outcomes
from trtllm_gateway.engine.builtin.sampler import Draws, PendingSample, Sampler, row_failure
from trtllm_gateway.engine.builtin.scheduler import DecodeRows, ScheduledChunk, Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence, Status
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.step_clock import StepClock
from trtllm_gateway.engine.builtin.step_failure import is_fatal, step_failed

FINISHED = Status.FINISHED
DEPTHS = (0, 1)  # a placeholder names a row of the previous step's samples only


@dataclass(slots=True)
class _Launched:
    seqs: list[Sequence]
    pending: PendingSample
    reads_history: bool  # a row needs the step resolved before the next one samples it


def _reads_history(seq: Sequence) -> bool:
    """Penalties and logits processors read the token history, and a constraint's mask needs
    its previous token."""
    return seq.penalized or seq.guided is not None or bool(seq.logits_bound)


def _unresolved(seq: Sequence) -> bool:
    """Still waits for its token: neither stopped nor aborted since the step was launched."""
    toks = seq.token_ids
    return seq.status is not FINISHED and bool(toks) and toks[-1] < 0


class StepPipeline:
    def __init__(
        self,
        scheduler: Scheduler,
        backend: Backend,
        sampler: Sampler,
        outcomes: Outcomes,
        depth: int,
    ) -> None:
        if depth not in DEPTHS:
            raise ValueError(f"overlap depth must be one of {DEPTHS}, got {depth}")
        self.scheduler = scheduler
        self.backend = backend
        self.sampler = sampler
        self.outcomes = outcomes
        self.depth = depth
        self.inflight: _Launched | None = None
        self.tables = DecodeTables()  # the decode rows' block tables, kept across steps
        self.clock = StepClock()  # where the steps go, logged when the core stops

    def forget(self, seq: Sequence) -> None:
        """An aborted sequence: drop its unresolved placeholder so its usage counts stay right."""
        if seq.token_ids and seq.token_ids[-1] < 0:
            seq.token_ids.pop()

    def step(self) -> Emitted:
        clock = self.clock
        clock.start()
        try:
            return self._step(clock)
        finally:
            clock.end()

    def _step(self, clock: StepClock) -> Emitted:
        events: Emitted = []
        if self.inflight is not None and self.inflight.reads_history:
            events += self._resolve()
            clock.lap("resolve")
        rows = self.scheduler.schedule_decodes()
        if rows is not None:
            clock.lap("schedule")
            return events + self._decode_step(rows, clock)
        chunks = self.scheduler.schedule()
        clock.lap("schedule")
        if not chunks:
            return events + self._resolve()
        try:
            launched = self._launch(chunks, clock)
        except Exception as e:  # this step's requests fail, not the engine (step_failure.py)
            if is_fatal(e):
                raise
            return events + self._fail(chunks, e)
        events += self._resolve()  # depth 1: the step before, while the device runs this one
        clock.lap("resolve")
        self.scheduler.commit([c for c in chunks if c.seq.status is not FINISHED])
        clock.lap("commit")
        return events + self._hold(launched)

    def _decode_step(self, rows: DecodeRows, clock: StepClock) -> Emitted:
        """_step's stages for a steady step's rows (Scheduler.schedule_decodes)."""
        try:
            batch = StepBatch.of_decodes(rows, self.scheduler.blocks.block_size, self.tables)
            clock.lap("build")
            n = len(rows.seqs)
            clock.size("decode", n, n)
            seqs = rows.seqs
            draws = None
            if self.backend.takes_draws:
                draws = self.sampler.draws(seqs, rows.draws_raw, rows.drawn)
            nonplain = rows.nonplain
            history = bool(nonplain) and any(_reads_history(seqs[i]) for i in nonplain)
            launched = self._forward(batch, seqs, draws, history, clock)
        except Exception as e:
            if is_fatal(e):
                raise
            return self._fail(rows.chunks(), e)
        events = self._resolve()
        clock.lap("resolve")
        self.scheduler.commit_decodes(rows)
        clock.lap("commit")
        return events + self._hold(launched)

    def _hold(self, launched: _Launched | None) -> Emitted:
        """A launched step's rows still running wait for their token as placeholders; at
        depth 0 it is resolved at once."""
        if launched is None:
            return []
        for row, seq in enumerate(launched.seqs):
            if seq.status is not FINISHED:
                seq.token_ids.append(-(row + 1))
        self.inflight = launched
        return self._resolve() if self.depth == 0 else []

    def _launch(self, chunks: list[ScheduledChunk], clock: StepClock) -> _Launched | None:
        """Pack, forward, sample; None when no chunk of the step samples."""
        batch = StepBatch.build(chunks, self.scheduler.blocks.block_size, self.tables)
        clock.lap("build")
        kind = "decode" if batch.num_decodes == len(chunks) else "mixed"
        clock.size(kind, len(chunks), len(batch.token_ids))
        seqs = list(batch.sample_seqs)
        draws = self.sampler.draws(seqs) if seqs and self.backend.takes_draws else None
        history = any(_reads_history(s) for s in seqs if not s.plain)
        return self._forward(batch, seqs, draws, history, clock)

    def _forward(
        self,
        batch: StepBatch,
        seqs: list[Sequence],
        draws: Draws | None,
        history: bool,
        clock: StepClock,
    ) -> _Launched | None:
        """The forward pass and the sampling launch (seqs: the rows that sample)."""
        prev = self.inflight.pending.token_ids if self.inflight is not None else None
        logits = self.backend.forward(batch, prev, draws)
        clock.lap("forward")
        if not seqs:
            return None
        launched = _Launched(seqs, self.sampler.sample(logits, seqs, draws), history)
        clock.lap("sample")
        return launched

    def _fail(self, chunks: list[ScheduledChunk], exc: Exception) -> Emitted:
        """The step in flight is good: resolve it; then fail the requests of the one that
        raised (nothing of it was committed), those the resolve did not finish."""
        events = self._resolve()
        failing = [c.seq for c in chunks if not c.seq.is_finished]
        for seq in failing:
            self.forget(seq)
        return events + self.outcomes.fail(failing, step_failed(exc, len(failing)))

    def _resolve(self) -> Emitted:
        launched, self.inflight = self.inflight, None
        events: Emitted = []
        if launched is None:
            return events
        pending = launched.pending
        bare = pending.bare  # most steps: no logprobs, no failed row
        tokens: list[int] = []
        results = []
        try:
            if bare:
                tokens = pending.tokens()
            else:
                results = pending.resolve()
        except Exception as e:  # the same rule as a launch's failure
            if is_fatal(e):
                raise
            live = [s for s in launched.seqs if _unresolved(s)]
            for seq in live:
                self.forget(seq)
            return self.outcomes.fail(live, step_failed(e, len(live)))
        now = time.perf_counter()
        if bare:
            self.outcomes.accept_tokens(launched.seqs, tokens, now, events)
            return events
        accept = self.outcomes.accept
        for seq, r in zip(launched.seqs, results, strict=True):
            toks = seq.token_ids
            if seq.status is FINISHED or not toks or toks[-1] >= 0:
                continue  # stopped or aborted while this step ran
            if r.error is not None:
                self.forget(seq)
                why = f"sampling failed: {r.error}"
                events += self.outcomes.fail([seq], row_failure(seq, why, r.internal))
                continue
            toks[-1] = r.token_id
            accept(seq, r, now, events)
        return events
