"""A forward pass or a sampler that raises fails the requests of its step, not the engine.

At overlap depth 0 (CPU's default) and 1 (CUDA's), both on the CPU backend: the step's requests
end with a RequestFailedError (a 500), their blocks go back, nothing of the step reaches the
prefix cache, and the next requests get the tokens they get on a fresh engine. An error that
means the device is broken (CUDA OOM, an asynchronous CUDA error) still ends the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.test_stepper import (
    PROMPTS,
    greedy,
    outcome,
    overlapped_stepper,
    plain_stepper,
    run_all,
    seq_for,
    tiny_model,
)
from trtllm_gateway.engine.builtin.sampler import Draws, PendingSample, Sampler
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.step_failure import is_fatal
from trtllm_gateway.engine.builtin.stepper import Stepper
from trtllm_gateway.engine.protocol import RequestFailedError, TokenEvent


class FailOnce:
    """Wraps a backend: the first step that computes request `bad` raises `error`."""

    def __init__(self, inner: Any, error: BaseException, bad: str = "bad") -> None:
        self.inner = inner
        self.error = error
        self.bad = bad
        self.raised = 0
        self.depth = inner.depth
        self.takes_draws = inner.takes_draws
        self.kv_caches = inner.kv_caches

    def forward(
        self, batch: StepBatch, prev: torch.Tensor | None, draws: Draws | None = None
    ) -> torch.Tensor:
        if not self.raised and any(c.seq.request_id == self.bad for c in batch.chunks):
            self.raised += 1
            raise self.error
        out: torch.Tensor = self.inner.forward(batch, prev, draws)
        return out


@dataclass(slots=True)
class RaisingPending(PendingSample):
    error: BaseException | None = None

    def tokens(self) -> list[int]:  # the wait for the ids, under resolve() and on its own
        assert self.error is not None
        raise self.error


class SamplerFailsOnce(Sampler):
    """The first step that samples request `bad` raises `error` in sample() or in resolve()."""

    def __init__(self, eos: tuple[int, ...], error: BaseException, where: str) -> None:
        super().__init__(eos)
        self.error = error
        self.where = where
        self.raised = 0

    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence], draws: Draws | None = None
    ) -> PendingSample:
        hit = not self.raised and any(s.request_id == "bad" for s in seqs)
        self.raised += hit
        if hit and self.where == "sample":
            raise self.error
        pending = Sampler.sample(self, logits, seqs, draws)
        if hit:
            return RaisingPending(pending.token_ids, pending.host, pending.ready, error=self.error)
        return pending


def stepper(tmp_path: Path, overlap: bool, error: BaseException) -> Stepper:
    lm = tiny_model(tmp_path, enable_prefix_caching=True)
    st = overlapped_stepper(lm)[0] if overlap else plain_stepper(lm)
    st.pipeline.backend = FailOnce(st.pipeline.backend, error)
    return st


@pytest.mark.parametrize("overlap", [False, True])
def test_a_forward_failure_fails_its_step_and_the_engine_goes_on(
    tmp_path: Path, overlap: bool
) -> None:
    fresh = plain_stepper(tiny_model(tmp_path))
    want = outcome(run_all(fresh, [seq_for("v", PROMPTS[2], greedy(9))]))
    st = stepper(tmp_path, overlap, RuntimeError("The expanded size of the tensor (64) must match"))
    # A request already decoding when the bad one arrives: it shares the failing step.
    early = seq_for("early", PROMPTS[1], greedy(30))
    st.add(early)
    for _ in range(3):
        st.step()
    bad = seq_for("bad", PROMPTS[3], greedy(8))
    st.add(bad)
    failed: dict[str, BaseException] = {}
    for _ in range(4):
        for request_id, ev in st.step():
            if not isinstance(ev, TokenEvent):
                failed[request_id] = ev
    assert set(failed) == {"early", "bad"}, failed
    for err in failed.values():
        assert isinstance(err, RequestFailedError) and "expanded size" in str(err)
    assert not st.seqs and not st.scheduler.has_work()
    blocks = st.scheduler.blocks
    assert blocks.num_free == blocks.num_blocks  # every block of the failed step went back
    # The core lives on: a later request gets what it gets on a fresh engine, and the failed
    # prompt's blocks were never registered in the prefix cache (their KV was never committed).
    assert st.scheduler.cached_prefix_tokens(list(PROMPTS[3])) == 0
    assert outcome(run_all(st, [seq_for("v", PROMPTS[2], greedy(9))])) == want


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("where", ["sample", "resolve"])
def test_a_sampler_failure_fails_its_step_on_both_depths(
    tmp_path: Path, overlap: bool, where: str
) -> None:
    """One rule for the forward, the sampler and the resolve (the CPU step used to answer a
    sampler's own failure with a 400 for the sampling rows, the CUDA step with a 500 for all)."""
    fresh = plain_stepper(tiny_model(tmp_path))
    want = outcome(run_all(fresh, [seq_for("v", PROMPTS[2], greedy(9))]))
    lm = tiny_model(tmp_path)
    st = overlapped_stepper(lm)[0] if overlap else plain_stepper(lm)
    sampler = SamplerFailsOnce(lm.cfg.eos_token_ids, RuntimeError("the sampler's bug"), where)
    st.pipeline.sampler = sampler
    early = seq_for("early", PROMPTS[1], greedy(30))
    st.add(early)
    for _ in range(3):
        st.step()
    st.add(seq_for("bad", PROMPTS[3], greedy(8)))
    failed: dict[str, BaseException] = {}
    for _ in range(4):
        for request_id, ev in st.step():
            if not isinstance(ev, TokenEvent):
                failed[request_id] = ev
    assert sampler.raised == 1
    assert set(failed) == {"early", "bad"}, failed
    for err in failed.values():
        assert isinstance(err, RequestFailedError) and "sampler's bug" in str(err)
    assert not st.seqs and not st.scheduler.has_work()
    assert lm.blocks.num_free == lm.blocks.num_blocks
    assert outcome(run_all(st, [seq_for("v", PROMPTS[2], greedy(9))])) == want


@pytest.mark.parametrize("overlap", [False, True])
def test_a_device_error_in_resolve_ends_the_core(tmp_path: Path, overlap: bool) -> None:
    lm = tiny_model(tmp_path)
    st = overlapped_stepper(lm)[0] if overlap else plain_stepper(lm)
    error = RuntimeError("CUDA error: an illegal memory access was encountered")
    st.pipeline.sampler = SamplerFailsOnce(lm.cfg.eos_token_ids, error, "resolve")
    st.add(seq_for("bad", PROMPTS[0], greedy(4)))

    def steps() -> None:
        for _ in range(3):
            st.step()

    with pytest.raises(RuntimeError, match="illegal memory access"):
        steps()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        MemoryError(),
    ],
    ids=["cuda-oom", "cuda-error", "host-oom"],
)
def test_an_error_that_means_the_device_is_broken_still_ends_the_core(
    tmp_path: Path, overlap: bool, error: BaseException
) -> None:
    assert is_fatal(error)
    st = stepper(tmp_path, overlap, error)
    st.add(seq_for("bad", PROMPTS[0], greedy(4)))

    def steps() -> None:
        for _ in range(3):
            st.step()

    with pytest.raises(type(error)):
        steps()


def test_what_is_fatal() -> None:
    assert not is_fatal(RuntimeError("The expanded size of the tensor (64) must match (7)"))
    assert not is_fatal(IndexError("index 99999 is out of bounds"))
    assert not is_fatal(ValueError("bad shape"))
    accelerator = getattr(torch, "AcceleratorError", None)
    if accelerator is not None:
        assert is_fatal(accelerator.__new__(accelerator))
