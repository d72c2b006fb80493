"""A decode graph samples inside itself (cuda_graph.py, sampler.Draws): the same tokens as the
sampler's own launch of the same kernel on the graph's logits.

One workload runs twice on the Triton backend with decode graphs, at depth 1: once as served (a
step whose rows all draw straight from the logits takes the graph's ids), once with the backend
told not to take Draws (every step's ids come from sampler.sample's launch). Greedy rows and
seeded rows at a temperature, a row with logprobs (its steps are not drawn in the graph: their
16-bit logits are widened and sampled by the sampler), and sampled rows that end first, so later
all-greedy steps must find the graph's temperatures zeroed again; a prompt that arrives mid-run
makes a mixed step read the ids a graph drew. Both dtypes: bf16 logits are
the graph's own (no float copy), float32 the fallback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.test_stepper import (
    PROMPTS,
    Recording,
    outcome,
    plain_stepper,
    run_all,
    seq_for,
    tiny_model,
)
from trtllm_gateway.engine.builtin.sampler import Draws
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.protocol import SamplingParams


class CountingDraws(Recording):
    """Recording, counting the steps whose ids the graph drew."""

    drawn = 0

    def forward(
        self, batch: StepBatch, prev: torch.Tensor | None, draws: Draws | None = None
    ) -> torch.Tensor:
        out = super().forward(batch, prev, draws)
        self.drawn += draws is not None and draws.ids is not None
        return out


def workload(logprobs: bool) -> list[Sequence]:
    def sp(i: int) -> SamplingParams:
        if i % 2:  # greedy, the longest
            return SamplingParams(max_tokens=24 + i, temperature=0.0, ignore_eos=True)
        return SamplingParams(
            max_tokens=6 + i, temperature=0.9, seed=11 + i, ignore_eos=True,
            logprobs=2 if logprobs and i == 2 else None,
        )  # fmt: skip

    return [seq_for(f"r{i}", p, sp(i)) for i, p in enumerate(PROMPTS)]


def late() -> dict[int, list[Sequence]]:
    """A prompt that arrives at step 5, while the graph draws the decodes: its step is a mixed
    one, whose placeholders read the ids the graph drew the step before."""
    sp = SamplingParams(max_tokens=9, temperature=0.9, seed=5, ignore_eos=True)
    return {5: [seq_for("late", PROMPTS[1][::-1], sp)]}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("logprobs", [False, True])
def test_the_graph_draws_the_samplers_tokens(tmp_path: Path, dtype: str, logprobs: bool) -> None:
    def run(takes_draws: bool) -> tuple[dict[str, tuple[list[int], str | None]], int, int]:
        lm = tiny_model(tmp_path, device="cuda", dtype=dtype, cuda_graphs=True, num_kv_blocks=64)
        st = plain_stepper(lm, depth=1)
        runner = CountingDraws(st.pipeline.backend)
        runner.takes_draws = takes_draws
        st.pipeline.backend = runner
        out = outcome(run_all(st, workload(logprobs), late=late()))
        decodes = sum(b.num_decodes == len(b.chunks) for b in runner.batches)
        return out, runner.drawn, decodes

    served, drawn, decodes = run(True)
    launched, none, _ = run(False)
    assert served == launched
    assert none == 0
    # Every step of decodes only was drawn in the graph, but those with the logprobs row.
    assert drawn > 0
    assert (drawn == decodes) != logprobs
    lens = {rid: len(toks) for rid, (toks, _) in served.items()}
    assert lens == {"r0": 6, "r1": 25, "r2": 8, "r3": 27, "late": 9}
