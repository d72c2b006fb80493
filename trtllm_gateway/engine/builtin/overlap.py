"""OverlapPipeline: schedule and launch step N+1 while the GPU still runs step N (CUDA only).

After step N is launched, each sampling sequence gets a placeholder token -(r + 1), r its row in
step N's sampled ids, which stay on the GPU. The scheduler only counts tokens, so step N+1 is
scheduled and launched at once; the runner swaps the placeholders for the real ids on the device.
Only then does the host wait for step N's ids (already copied by then) and run the stop checks
and events. A sequence that stopped at step N has one wasted token computed in step N+1, whose
result is dropped. Steps that sample with penalties (which read the token history) or with a
grammar constraint (whose mask needs the previous token) resolve the step in flight first.

The pipeline is given its collaborators (the scheduler, the runner, the sampler, and the Outcomes
that turn a resolved token into its event), not the Stepper that owns it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trtllm_gateway.engine.builtin.outcomes import Emitted, Outcomes
from trtllm_gateway.engine.builtin.sampler import PendingSample, Sampler, row_failure
from trtllm_gateway.engine.builtin.scheduler import ScheduledChunk, Scheduler, StepOutput
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.step_failure import is_fatal, step_failed

if TYPE_CHECKING:
    import torch


class StepRunner(Protocol):
    """What the pipeline needs of ModelRunner: a forward pass that resolves placeholder ids."""

    def run(self, chunks: list[ScheduledChunk], prev: torch.Tensor | None = None) -> StepOutput:
        """prev: the previous step's sampled ids on the device, for placeholders -(r + 1)."""
        ...


@dataclass(slots=True)
class _InFlight:
    seqs: list[Sequence]
    pending: PendingSample


def _reads_history(seq: Sequence) -> bool:
    """Penalties and logits processors read the token history, and a constraint's mask needs
    its previous token."""
    sp = seq.sampling
    return bool(
        sp.repetition_penalty != 1.0
        or sp.presence_penalty
        or sp.frequency_penalty
        or seq.guided is not None
        or seq.logits_bound
    )


class OverlapPipeline:
    def __init__(
        self, scheduler: Scheduler, runner: StepRunner, sampler: Sampler, outcomes: Outcomes
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.sampler = sampler
        self.outcomes = outcomes
        self.inflight: _InFlight | None = None

    def forget(self, seq: Sequence) -> None:
        """An aborted sequence: drop its unresolved placeholder so its usage counts stay right."""
        if seq.token_ids and seq.token_ids[-1] < 0:
            seq.token_ids.pop()

    def step(self) -> Emitted:
        events: Emitted = []
        if self.inflight is not None and any(_reads_history(s) for s in self.inflight.seqs):
            events += self._drain()
        chunks = self.scheduler.schedule()
        if not chunks:
            return events + self._drain()
        prev = self.inflight.pending.token_ids if self.inflight is not None else None
        try:
            out = self.runner.run(chunks, prev)
            seqs = [c.seq for c in out.sample_chunks]
            pending = self.sampler.sample_async(out.logits, seqs) if seqs else None
        except Exception as e:  # this step's requests fail, not the engine (step_failure.py)
            if is_fatal(e):
                raise
            return events + self._fail(chunks, e)
        # The GPU now runs this step; finish the previous one on the host meanwhile.
        events += self._drain()
        self.scheduler.commit([c for c in chunks if not c.seq.is_finished])
        for row, seq in enumerate(seqs):
            if not seq.is_finished:
                seq.token_ids.append(-(row + 1))
        self.inflight = _InFlight(seqs, pending) if pending is not None else None
        return events

    def _fail(self, chunks: list[ScheduledChunk], exc: Exception) -> Emitted:
        """The step in flight is good: resolve it; then fail the requests of the one that
        raised (nothing of it was committed), those the drain did not finish."""
        events = self._drain()
        failing = [c.seq for c in chunks if not c.seq.is_finished]
        for seq in failing:
            self.forget(seq)
        return events + self.outcomes.fail(failing, step_failed(exc, len(failing)))

    def _drain(self) -> Emitted:
        inflight, self.inflight = self.inflight, None
        events: Emitted = []
        if inflight is None:
            return events
        results = inflight.pending.resolve()
        now = time.perf_counter()
        for seq, r in zip(inflight.seqs, results, strict=True):
            if seq.is_finished or not seq.token_ids or seq.token_ids[-1] >= 0:
                continue  # stopped or aborted while this step ran
            if r.error is not None:
                self.forget(seq)
                why = f"sampling failed: {r.error}"
                events += self.outcomes.fail([seq], row_failure(seq, why, r.internal))
                continue
            seq.token_ids[-1] = r.token_id
            self.outcomes.accept(seq, r, now, events)
        return events
