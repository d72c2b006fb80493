"""KvTransferWorker on CPU: a prompt's blocks gathered into the shared-memory arena by one core's
worker and scattered into another core's reserved blocks by its worker, byte for byte, with
the step thread only queueing (what it spends is bench/kv_copy.py's figure, not asserted here)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from trtllm_gateway.engine.builtin.kv_transfer_worker import KvTransferWorker, Loaded, Staged
from trtllm_gateway.engine.kv_region import RegionAllocator

LAYERS, SLOTS, HEADS, DIM, BS = 3, 64 * 16, 2, 8, 16
LAYOUT = f"t:{LAYERS}x{HEADS}x{DIM}:torch.float32:bs{BS}"


def caches(fill: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    kv = torch.zeros(LAYERS, 2, SLOTS, HEADS, DIM)
    if fill:
        kv.copy_(torch.randn_like(kv))
    return [(kv[i, 0], kv[i, 1]) for i in range(LAYERS)]


class Done:
    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self) -> None:
        self.event.set()


def wait(worker: KvTransferWorker, done: Done) -> list[Staged | Loaded]:
    assert done.event.wait(10)
    done.event.clear()
    return worker.done()


@pytest.fixture
def pair() -> Iterator[tuple[KvTransferWorker, KvTransferWorker, Done, Done]]:
    a, b = Done(), Done()
    src = KvTransferWorker(caches(True), BS, torch.device("cpu"), LAYOUT, 1 << 20, 30.0, a)
    dst = KvTransferWorker(caches(False), BS, torch.device("cpu"), LAYOUT, 1 << 20, 30.0, b)
    yield src, dst, a, b
    src.close()
    dst.close()


def test_staged_blocks_land_in_the_reserved_blocks(
    pair: tuple[KvTransferWorker, KvTransferWorker, Done, Done],
) -> None:
    src, dst, a, b = pair
    prefill_blocks, tokens = [7, 2, 40], 37  # out of order, the last block partly filled
    assert src.stage("r", prefill_blocks, tokens, device=False) == ""
    (staged,) = wait(src, a)
    assert isinstance(staged, Staged) and staged.region is not None
    region = staged.region
    assert region.transport == "shm" and region.shape == (LAYERS, 2, tokens, HEADS, DIM)
    decode_blocks = [11, 3, 9]
    dst.load("r", region, None, decode_blocks)
    (loaded,) = wait(dst, b)
    assert loaded == Loaded("r")
    for (sk, sv), (dk, dv) in zip(src.caches, dst.caches, strict=True):
        for s_cache, d_cache in ((sk, dk), (sv, dv)):
            for i in range(tokens):
                s = prefill_blocks[i // BS] * BS + i % BS
                d = decode_blocks[i // BS] * BS + i % BS
                assert torch.equal(s_cache[s], d_cache[d])
    # Nothing else was written: the slots past the prompt in the last block stay zero.
    last = decode_blocks[2] * BS
    assert not dst.caches[0][0][last + tokens % BS : last + BS].any()
    assert src.free("r") and not src.free("r")


def test_nan_kv_is_refused_and_a_full_arena_says_so(
    pair: tuple[KvTransferWorker, KvTransferWorker, Done, Done],
) -> None:
    src, dst, a, b = pair
    src.caches[1][1][5 * BS] = float("nan")
    assert src.stage("n", [5], 4, device=False) == ""
    (staged,) = wait(src, a)
    assert isinstance(staged, Staged) and staged.region is not None
    dst.load("n", staged.region, None, [1])
    (loaded,) = wait(dst, b)
    assert isinstance(loaded, Loaded) and "NaN" in loaded.error
    assert not dst.caches[1][1].isnan().any()  # refused before the scatter
    # 1 MiB of arena holds 1 MiB of KV: a prompt that needs more is refused at once.
    huge = 1 + (1 << 20) // (LAYERS * 2 * HEADS * DIM * 4)
    assert "full" in src.stage("big", list(range(huge // BS + 1)), huge, device=False)


def test_region_allocator_first_fit_free_and_expire() -> None:
    alloc = RegionAllocator(5 * 4096, start=64)
    a = alloc.alloc(4096, "a", 10.0)
    b = alloc.alloc(1, "b", 20.0)
    assert (a, b) == (64, 64 + 4096)
    assert alloc.alloc(4 * 4096, "c", 1.0) is None  # only 3 pages and change are left
    assert alloc.free("a")
    assert alloc.alloc(100, "d", 5.0) == 64  # the hole a left
    assert alloc.expire(6.0) == ["d"]
    assert alloc.owners() == ["b"]
