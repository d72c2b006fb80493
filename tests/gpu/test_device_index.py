"""A bare "cuda" device (`--device cuda`, or auto on a GPU host) gets its index before anything
uses it: torch.cuda.set_device("cuda") raises (torch/_utils.py _get_device_index: "Expected a
torch.device with a specified index"), and the KV transfer thread calls it at its start. Found
2026-11-28 when bench.profile_step (device auto) killed that thread on an H200.

    python -m pytest tests/gpu/test_device_index.py -m gpu -q
"""

from __future__ import annotations

import time

import pytest
import torch

from trtllm_gateway.engine.builtin.device_dtype import pick_device
from trtllm_gateway.engine.builtin.kv_transfer_worker import KvTransferWorker


def test_a_bare_cuda_device_gets_the_current_index() -> None:
    for name in ("auto", "cuda"):
        assert pick_device(name) == torch.device("cuda", torch.cuda.current_device())
    assert pick_device("cuda:0").index == 0
    with pytest.raises(ValueError, match="specified index"):  # what the index spares the thread
        torch.cuda.set_device(torch.device("cuda"))


def test_the_transfer_thread_lives_on_a_bare_cuda_device() -> None:
    cache = torch.zeros(8, 16, 1, 8, dtype=torch.bfloat16, device="cuda")
    worker = KvTransferWorker(
        [(cache, cache.clone())], 16, torch.device("cuda"), "nhd", 1 << 20, 5.0, lambda: None
    )
    time.sleep(0.5)
    assert worker.device.index is not None
    assert worker._thread.is_alive()
    worker.close()
