"""StepClock: where a serving core's steps go, stage by stage, in wall time and in the thread's
CPU time; logged when the core stops (issue 39, item 2).

py-spy of a serving core (135M at 256 running, H200 hosts, 2026-11-28) found every stage of the
step 2-6x slower than the same code timed alone (bench.host_step, micro-benchmarks). A stage's
wall time far above its CPU time says the thread waited (for the GIL, or the OS's scheduler);
the two close together say the code itself ran slowly (cold caches, a low clock). `between` is
the loop's work from the end of one step to the start of the next: the batch for the API
servers, their messages, admissions. Every EVERY-th step is timed (thread_time is a system
call), so the clock costs well under a microsecond a step. A step's `kind` (the pipeline's:
"decode" for a step of decodes only, which replays a CUDA graph, "mixed" for one with a prompt
chunk) splits the sums too: a few long mixed steps would otherwise hide what the common step
costs. Every step (timed or not) counts its sequences and tokens by kind (`size`): a served
run's mean batch says how full the steps ran, which the stage times alone do not.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

EVERY = 8


@dataclass(slots=True)
class StepClock:
    every: int = EVERY
    steps: int = 0
    timed: int = 0
    on: bool = False  # this step is timed
    kind: str = "mixed"  # this step's kind, set by the pipeline once it is known
    # By kind: timed steps, and seconds by stage (wall, CPU).
    kinds: dict[str, tuple[int, dict[str, float], dict[str, float]]] = field(default_factory=dict)
    _laps: list[tuple[str, float, float]] = field(default_factory=list)  # this step's
    _at: tuple[float, float] = (0.0, 0.0)  # the last lap's (wall, cpu)
    _ended: tuple[float, float] | None = None  # when the step before ended (a timed one's)
    # By kind, over every step: [steps, sequences, tokens].
    sizes: dict[str, list[int]] = field(default_factory=dict)

    def start(self) -> None:
        """A step begins; if it is timed, `between` gets the time since the step before ended."""
        self.steps += 1
        self.on = self.steps % self.every == 0
        self.kind = "mixed"
        if not self.on:
            return
        self.timed += 1
        self._at = _now()
        if self._ended is not None:
            self._add("between", self._ended, self._at)

    def size(self, kind: str, seqs: int, tokens: int) -> None:
        """This step's kind and size: every step, timed or not."""
        self.kind = kind
        n = self.sizes.get(kind)
        if n is None:
            self.sizes[kind] = [1, seqs, tokens]
        else:
            n[0] += 1
            n[1] += seqs
            n[2] += tokens

    def lap(self, stage: str) -> None:
        """The stage since the last lap (or the start) ends now; only on a timed step."""
        if self.on:
            start, self._at = self._at, _now()
            self._add(stage, start, self._at)

    def end(self) -> None:
        """The step ends; if the next one is timed, its `between` starts here."""
        if self.on:
            n, wall, cpu = self.kinds.get(self.kind) or (0, {}, {})
            for stage, w, c in self._laps:
                wall[stage] = wall.get(stage, 0.0) + w
                cpu[stage] = cpu.get(stage, 0.0) + c
            self.kinds[self.kind] = (n + 1, wall, cpu)
            self._laps.clear()
        self.on = False
        self._ended = _now() if (self.steps + 1) % self.every == 0 else None

    def _add(self, stage: str, start: tuple[float, float], end: tuple[float, float]) -> None:
        self._laps.append((stage, end[0] - start[0], end[1] - start[1]))

    @property
    def wall(self) -> dict[str, float]:
        """Seconds by stage over every timed step that ended, wall time."""
        return _total(k[1] for k in self.kinds.values())

    @property
    def cpu(self) -> dict[str, float]:
        """The same in the thread's CPU time."""
        return _total(k[2] for k in self.kinds.values())

    def summary(self) -> str:
        by_kind = "; ".join(
            f"{kind} steps ({n} timed): {_stages(n, wall, cpu)}"
            for kind, (n, wall, cpu) in sorted(self.kinds.items())
        )
        sizes = "; ".join(
            f"{kind} {n} steps, {seqs / n:.1f} sequences and {tokens / n:.1f} tokens a step"
            for kind, (n, seqs, tokens) in sorted(self.sizes.items())
        )
        return (
            f"{self.steps} steps ({self.timed} timed), ms a step, wall/CPU of the core's "
            f"thread: {_stages(self.timed, self.wall, self.cpu)}; {by_kind}; every step: {sizes}"
        )


def _total(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for stage, seconds in part.items():
            out[stage] = out.get(stage, 0.0) + seconds
    return out


def _stages(n: int, wall: dict[str, float], cpu: dict[str, float]) -> str:
    n = max(n, 1)
    return ", ".join(f"{k} {wall[k] / n * 1e3:.3f}/{cpu[k] / n * 1e3:.3f}" for k in wall)


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()
