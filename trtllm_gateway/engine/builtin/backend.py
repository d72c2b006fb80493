"""Backend: the seam where a device runs a StepBatch's forward pass, and what both backends share.

CpuBackend (cpu_backend.py: SDPA and cpu_kernels/) and TritonBackend (triton_backend.py: Triton
kernels, pinned uploads, CUDA graphs) take the same StepBatch and return the logits of its
sampled rows; the step pipeline (pipeline.py) knows nothing else of them. Both swap placeholder
ids for the previous step's samples on their device and fill prompt logprobs the same way here.
"""

from __future__ import annotations

from typing import Protocol

import torch

from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.sampler import Draws, logprob_entry
from trtllm_gateway.engine.builtin.step_batch import StepBatch

KvCaches = list[tuple[torch.Tensor, torch.Tensor]]


class Backend(Protocol):
    kv_caches: KvCaches
    # Steps the host resolves behind the device by default (pipeline.py): 1 where the device
    # runs a step while the host prepares the next one, 0 where the host computes it.
    depth: int
    # It can sample a step's rows itself, given their Draws before the forward (sampler.py).
    takes_draws: bool

    def forward(
        self, batch: StepBatch, prev: torch.Tensor | None, draws: Draws | None = None
    ) -> torch.Tensor:
        """The logits [len(batch.sample_rows), vocab] of the batch's sampled rows: float32, or
        the model's dtype from a decode graph.

        prev: the previous step's sampled ids on the device, for placeholders -(r + 1); None
        when the batch has none. draws: the step's Draws (every row draws straight from the
        logits), which a backend that samples inside its forward fills in (draws.ids). Prompt
        logprobs of the batch's chunks are filled in on the way.
        """
        ...


def resolve_placeholders(ids: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
    """ids with each placeholder -(r + 1) replaced by row r of prev (a new tensor)."""
    assert prev is not None, "placeholder token ids need the previous step's samples"
    idx = (-ids - 1).clamp_(min=0)
    return torch.where(ids < 0, prev[idx], ids)


def fill_prompt_logprobs(model: LlamaModel, batch: StepBatch, hidden: torch.Tensor) -> None:
    """Logprob of each prompt token given the ones before it (row p predicts token p + 1)."""
    for c, row in batch.prompt_logprobs:
        seq = c.seq
        k = seq.sampling.prompt_logprobs or 0
        last = min(c.start + c.length, seq.prompt_len - 1)  # exclusive bound on predicting rows
        if last > c.start:
            lp = model.compute_logits(hidden[row : row + last - c.start]).log_softmax(-1)
            for i in range(last - c.start):
                target = seq.token_ids[c.start + i + 1]
                seq.prompt_logprobs.append(logprob_entry(lp[i], target, k))
        if c.start + c.length >= seq.prompt_len:
            seq.prompt_logprobs_done = True
