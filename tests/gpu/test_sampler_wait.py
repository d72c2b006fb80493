"""The step's wait for its sampled ids sleeps (issue 39, item 2): sampler.PendingSample.resolve()
waits on a blocking-sync event, so the engine core's thread does not spin a CPU core while the
GPU works. A spinning cudaEventSynchronize uses about as much CPU time as it waits."""

from __future__ import annotations

import time

import pytest
import torch

from tests.unit.test_sampler import EOS, _seq
from trtllm_gateway.engine.builtin import sampler as sampler_module
from trtllm_gateway.engine.builtin.sampler import Sampler
from trtllm_gateway.engine.protocol import SamplingParams


def _resolve_cpu_and_wall(sleep_cycles: int) -> tuple[float, float]:
    logits = torch.randn(2, 64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)  # type: ignore[attr-defined]  # the GPU busy for a while
    pending = Sampler((EOS,)).sample(logits, [_seq(SamplingParams(temperature=0.0))] * 2)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    results = pending.resolve()
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    assert [r.token_id for r in results] == logits.argmax(-1).tolist()
    return cpu, wall


def test_resolve_sleeps_while_the_gpu_works() -> None:
    assert sampler_module.BLOCKING_WAIT
    cycles = 500_000_000  # ~0.25-0.3 s on an H100 / H200
    _resolve_cpu_and_wall(1000)  # warm-up: the Triton sampler's compile
    cpu, wall = _resolve_cpu_and_wall(cycles)
    assert wall > 0.1, wall  # the wait is real
    assert cpu < 0.25 * wall, (cpu, wall)  # and it did not spin


def test_a_spinning_wait_would_fail_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measure can fail: with BLOCKING_WAIT off the same wait uses ~all its time on a CPU."""
    monkeypatch.setattr(sampler_module, "BLOCKING_WAIT", False)
    _resolve_cpu_and_wall(1000)
    cpu, wall = _resolve_cpu_and_wall(500_000_000)
    assert wall > 0.1 and cpu > 0.5 * wall, (cpu, wall)
