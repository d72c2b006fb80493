"""kernels/kv_blocks.py: a prompt's KV gathered from and scattered into the paged pool in one
launch equals the per-layer index ops (the path caches that are not one pool take), for every
cache dtype, a shuffled block table and a partial last block.

    python -m pytest tests/gpu/test_kv_blocks.py -m gpu -q
"""

from __future__ import annotations

import pytest
import torch

from trtllm_gateway.engine.builtin.kv_staging import gather, pool_of, scatter, scatter_checked

pytestmark = pytest.mark.gpu
BS = 16


def pool(dtype: torch.dtype, layers: int = 3, blocks: int = 40) -> torch.Tensor:
    raw = torch.randint(
        0, 255, (layers, 2, blocks * BS, 2, 64 * 4 // dtype.itemsize), dtype=torch.uint8
    )
    return raw.view(dtype).cuda()


def split(kv: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Separate tensors per layer and K/V: pool_of is None, so the per-layer path runs."""
    return [(kv[i, 0].clone(), kv[i, 1].clone()) for i in range(kv.shape[0])]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("tokens", [1, 16, 23, 200])
def test_one_launch_equals_per_layer_ops(dtype: torch.dtype, tokens: int) -> None:
    kv = pool(dtype)
    caches = [(kv[i, 0], kv[i, 1]) for i in range(kv.shape[0])]
    assert pool_of(caches) is not None and pool_of(split(kv)) is None
    table = torch.randperm(40)[: -(-tokens // BS)].tolist()
    shape = (kv.shape[0], 2, tokens, *kv.shape[3:])
    fast = torch.empty(shape, dtype=dtype, device="cuda")
    slow = torch.empty(shape, dtype=dtype, device="cuda")
    gather(caches, table, BS, fast)
    gather(split(kv), table, BS, slow)
    assert torch.equal(fast.view(torch.uint8), slow.view(torch.uint8))

    into, ref = torch.zeros_like(kv.view(torch.uint8)).view(dtype), split(torch.zeros_like(kv))
    dest = torch.randperm(40)[: len(table)].tolist()
    scatter([(into[i, 0], into[i, 1]) for i in range(kv.shape[0])], dest, BS, fast)
    scatter(ref, dest, BS, slow)
    want = torch.stack([torch.stack(pair) for pair in ref])
    assert torch.equal(into.view(torch.uint8), want.view(torch.uint8))
    # The prompt's tokens landed, the rest of the pool stayed zero.
    written = into.view(torch.uint8).ne(0).any(dim=(0, 1, 3, 4)).nonzero().flatten().tolist()
    slots = {b * BS + t % BS for t in range(tokens) for b in [dest[t // BS]]}
    assert set(written) <= slots


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_scatter_checked_refuses_a_nan_and_leaves_no_trace(dtype: torch.dtype) -> None:
    kv = torch.zeros(3, 2, 40 * BS, 2, 64, dtype=torch.float32, device="cuda").to(dtype)
    caches = [(kv[i, 0], kv[i, 1]) for i in range(3)]
    src = torch.randn(3, 2, 23, 2, 64, device="cuda").to(dtype)
    table = [7, 3]
    assert scatter_checked(caches, table, BS, src)
    ref = split(torch.zeros_like(kv.view(torch.uint8)).view(dtype))
    scatter(ref, table, BS, src)
    want = torch.stack([torch.stack(pair) for pair in ref])
    assert torch.equal(kv.view(torch.uint8), want.view(torch.uint8))
    for bad in (float("nan"), float("inf")):
        if dtype == torch.float8_e4m3fn and bad == float("inf"):
            continue  # e4m3 has no infinity (it saturates to NaN)
        poisoned = src.clone()
        poisoned[2, 1, 22, 1, 63] = torch.tensor(bad).to(dtype)
        kv.zero_()
        assert not scatter_checked(caches, table, BS, poisoned)
        assert not kv.view(torch.uint8).any()  # the blocks were zeroed again


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@two_gpus
@pytest.mark.parametrize("layers", [1, 5, 32])
@pytest.mark.parametrize("nan_at", [None, 0, -1])
def test_a_peer_region_scatters_as_a_local_one(layers: int, nan_at: int | None) -> None:
    """scatter_checked of a region on cuda:0 into a pool on cuda:1 (the cuda_ipc path's copy
    across, then the one-launch scatter) equals scattering a local copy; a NaN in the first or
    the last layer is refused with the blocks zeroed."""
    dtype, tokens = torch.bfloat16, 200
    table = torch.randperm(40)[: -(-tokens // BS)].tolist()
    src = torch.randn(layers, 2, tokens, 2, 64, device="cuda:0").to(dtype)
    if nan_at is not None:
        src[nan_at, 1, tokens // 2, 0, 3] = float("nan")
    with torch.cuda.device(1):
        into = torch.zeros(layers, 2, 40 * BS, 2, 64, dtype=dtype, device="cuda:1")
        ref = torch.zeros_like(into)
        ok = scatter_checked([(into[i, 0], into[i, 1]) for i in range(layers)], table, BS, src)
        torch.cuda.synchronize()
        scatter([(ref[i, 0], ref[i, 1]) for i in range(layers)], table, BS, src.to("cuda:1"))
    if nan_at is None:
        assert ok and torch.equal(into.view(torch.uint8), ref.view(torch.uint8))
    else:
        assert not ok and not into.view(torch.uint8).any()
