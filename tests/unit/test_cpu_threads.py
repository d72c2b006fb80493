"""Small CPU kernel calls run on the calling thread, large ones keep torch's (cpu_threads.py)."""

from __future__ import annotations

import pytest
import torch

from trtllm_gateway.engine.builtin import cpu_threads
from trtllm_gateway.engine.builtin.cpu_threads import (
    CONTENDED_ABOVE,
    FREE_BELOW,
    MIN_PARALLEL_FMAS,
    MIN_PARALLEL_FMAS_FREE,
    ThreadPolicy,
    sized,
    threads_for,
)
from trtllm_gateway.engine.builtin.run_queue import RunQueueWait


class Shares(RunQueueWait):
    """A run-queue gauge that reports the given shares, one a call (None: no new sample)."""

    def __init__(self, *shares: float | None) -> None:
        super().__init__()
        self._shares = list(shares)

    def share(self) -> float | None:
        return self._shares.pop(0) if self._shares else None


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> object:
    """Two torch threads, and a process policy that stays contended (the real one may have
    measured this machine free by now)."""
    monkeypatch.setattr(cpu_threads, "POLICY", ThreadPolicy(Shares()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_calls_get_one_thread_and_large_ones_keep_them(two_threads: object) -> None:
    policy = ThreadPolicy(Shares())  # no sample yet: contended, the conservative threshold
    with threads_for(MIN_PARALLEL_FMAS - 1, policy):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2  # restored
    with threads_for(MIN_PARALLEL_FMAS, policy):
        assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), threads_for(1, policy):
        raise RuntimeError("a kernel's error")
    assert torch.get_num_threads() == 2  # restored on errors too


def test_small_calls_get_both_threads_only_while_the_cores_are_free(
    two_threads: object,
) -> None:
    seen: list[int] = []
    mid = MIN_PARALLEL_FMAS // 2
    # free, then between the thresholds (stays free), contended, between (stays contended), free
    shares = (0.0, (FREE_BELOW + CONTENDED_ABOVE) / 2, CONTENDED_ABOVE + 0.01, FREE_BELOW, 0.01)
    policy = ThreadPolicy(Shares(*shares))
    for _ in shares:
        with threads_for(mid, policy):
            seen.append(torch.get_num_threads())
    assert seen == [2, 2, 1, 1, 2]
    assert MIN_PARALLEL_FMAS_FREE < 300_000  # free: even a batch-1 projection (o: 576 x 576)


def test_sized_sizes_each_call_by_its_arguments(two_threads: object) -> None:
    seen: list[int] = []

    def kernel(rows: int) -> int:
        seen.append(torch.get_num_threads())
        return rows

    call = sized(kernel, lambda rows: rows * cpu_threads.MIN_PARALLEL_FMAS // 32)
    assert [call(1), call(32)] == [1, 32]
    assert seen == [1, 2]


def test_a_decode_sized_packed_projection_runs_on_one_thread_while_contended(
    two_threads: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2's gate_up at batch 1 (576 -> 3072: 1.8M multiply-adds) vs at 8 rows (14M); on a
    free CPU batch 1 gets both threads too."""
    from torch import nn

    from trtllm_gateway.engine.builtin.packed_linear import PackedLinear

    seen: list[int] = []

    def mm(x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return torch.zeros(x.shape[0], 3072)

    class Kernels:  # only what PackedLinear's float32 path calls
        q4_1_mm = staticmethod(mm)
        q8_0_mm = staticmethod(mm)

    packed = PackedLinear(
        nn.Linear(576, 3072, bias=False),
        "q4_1",
        (torch.zeros(3072, 288, dtype=torch.uint8), torch.zeros(3072, 18, 2)),
        Kernels,  # type: ignore[arg-type]
    )
    packed(torch.randn(1, 576))
    packed(torch.randn(8, 576))
    monkeypatch.setattr(cpu_threads, "POLICY", ThreadPolicy(Shares(0.0)))  # measured free
    packed(torch.randn(1, 576))
    assert seen == [1, 2, 2]


def test_the_engine_leaves_openmp_waiting_to_libgomp_and_the_environment_alone() -> None:
    """libgomp's default (spin GOMP_SPINCOUNT = 300000 times, then sleep), not PASSIVE (0), in a
    process that imports the built-in engine; and nothing of it in os.environ after (children
    inherit nothing). libgomp prints what it read as it loads with OMP_DISPLAY_ENV=VERBOSE."""
    import os
    import subprocess
    import sys

    code = "import os, trtllm_gateway.engine.builtin.core; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "GOMP_SPINCOUNT = '300000'" in out.stderr, out.stderr[-2000:]
    assert out.stdout.strip() == "None"
    env["OMP_WAIT_POLICY"] = "PASSIVE"  # an operator's choice still reaches libgomp
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "GOMP_SPINCOUNT = '0'" in out.stderr, out.stderr[-2000:]
