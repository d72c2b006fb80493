"""One step path (issue 37 item 1): the CUDA step and the CPU step pack the same StepBatches.

One workload (tests/unit/test_stepper.py's, greedy, lengths that end at different steps) runs at
depth 1 on the Triton backend (CUDA) and on the CPU backend; every batch each backend was given is
recorded. With ample blocks nothing is preempted, so at depth 1 every decode id is a placeholder
and the batches do not depend on the tokens either device sampled: they must be equal, field by
field (the tokens are another matter: tests/gpu/test_greedy_equivalence.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.unit.test_stepper import (
    Recording,
    outcome,
    overlapped_stepper,
    run_all,
    tiny_model,
    workload,
)
from trtllm_gateway.engine.builtin.step_batch import StepBatch


def fields(b: StepBatch) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in StepBatch.__slots__:
        v = getattr(b, name)
        if isinstance(v, np.ndarray):
            out[name] = (v.dtype.str, v.shape, v.tolist())
        elif name == "packed_chunks":  # a steady step's are made from its rows: chunks
            out["chunks"] = [(c.seq.request_id, c.start, c.length) for c in b.chunks]
        elif name == "decode_rows":
            out[name] = None if v is None else ([s.request_id for s in v.seqs], v.grown)
        elif name == "sample_seqs":
            out[name] = [s.request_id for s in v]
        elif name == "prompt_logprobs":
            out[name] = [(c.seq.request_id, row) for c, row in v]
        elif name == "images":
            out[name] = [(r.row, r.first, r.end) for r in v]
        else:
            out[name] = v
    return out


def record(tmp_path: Path, device: str) -> list[dict[str, Any]]:
    lm = tiny_model(tmp_path, device=device, num_kv_blocks=64)
    st, runner = overlapped_stepper(lm)
    assert isinstance(runner, Recording)
    if device == "cuda":
        from trtllm_gateway.engine.builtin.triton_backend import TritonBackend

        assert isinstance(runner.inner, TritonBackend)
    result = outcome(run_all(st, workload()))
    assert [len(t) for t, _ in result.values()] == [6, 11, 16, 21]
    assert st.scheduler.preemptions == 0
    for b in runner.batches:  # the premise: no sampled id of either device is in a batch
        assert (b.token_ids[: b.num_decodes] < 0).all()
    return [fields(b) for b in runner.batches]


def test_cuda_and_cpu_steps_pack_the_same_batches(tmp_path: Path) -> None:
    cuda_batches = record(tmp_path, "cuda")
    cpu_batches = record(tmp_path, "cpu")
    assert len(cuda_batches) == len(cpu_batches)
    for i, (a, b) in enumerate(zip(cuda_batches, cpu_batches, strict=True)):
        assert a == b, f"step {i}"
    assert any(b["placeholders"] for b in cpu_batches)
