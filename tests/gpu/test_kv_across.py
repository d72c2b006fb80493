"""engine/builtin/kv_across.py on GPUs: a prompt's blocks read in place from another process's
pool (on cuda:0) into ours (cuda:1 where there are two GPUs, else cuda:0), as a decode core reads
its prefill sibling's: equal to the same blocks moved on the CPU, for every cache dtype and a
partial last block; a NaN refused with the reserved blocks zeroed; a pool that is not one
tensor falls back to the staged arena.

The exporter is a process of its own (spawn): the mapping is made as a decode core makes it,
with cudaIpcOpenMemHandle on our device (peer_memory.py), where torch's own open_ipc maps it in
cuda:0's context and a cuda:1 kernel reading it faults (measured on two H200, 2026-11-27).

    python -m pytest tests/gpu/test_kv_across.py -m gpu -q
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.connection import Connection

import msgspec
import pytest
import torch

from trtllm_gateway.engine.builtin.kv_across import AcrossReader, DevicePool
from trtllm_gateway.engine.builtin.kv_staging import Sources, pool_of
from trtllm_gateway.engine.kv_region import KvRegion

pytestmark = pytest.mark.gpu
BS = 16
SRC_BLOCKS, DST_BLOCKS, LAYERS = 40, 24, 3
DEST = "cuda:1" if torch.cuda.is_available() and torch.cuda.device_count() > 1 else "cuda:0"


def host_pool(dtype: torch.dtype, blocks: int, seed: int) -> torch.Tensor:
    """The same bytes in any process: drawn on the CPU from a seed."""
    g = torch.Generator().manual_seed(seed)
    shape = (LAYERS, 2, blocks * BS, 2, 64 * 4 // dtype.itemsize)
    return torch.randint(0, 255, shape, dtype=torch.uint8, generator=g).view(dtype)


def finite(kv: torch.Tensor) -> torch.Tensor:
    """Random bytes with every NaN / infinity pattern cleared (zeroed)."""
    if kv.dtype == torch.float8_e4m3fn:
        bad = (kv.view(torch.uint8) & 0x7F) == 0x7F
    else:
        bad = ~torch.isfinite(kv)
    kv.view(torch.uint8).view(*kv.shape, -1)[bad] = 0
    return kv


def exporter(
    conn: Connection, dtype: torch.dtype, table: list[int], tokens: int, nan: bool
) -> None:
    kv = finite(host_pool(dtype, SRC_BLOCKS, 1))
    if nan:  # the prompt's last token of the last layer's V
        slot = table[(tokens - 1) // BS] * BS + (tokens - 1) % BS
        kv.view(torch.uint8)[-1, 1, slot, 0, : dtype.itemsize] = 0xFF
    pool = kv.to("cuda:0")
    caches = [(pool[i, 0], pool[i, 1]) for i in range(LAYERS)]
    shared = DevicePool.of(caches, "t:3x2x64:x:bs16")
    assert shared is not None
    conn.send(msgspec.json.encode(shared.describe(table, tokens, BS)))
    conn.recv()  # the importer has read it


def read_across(dtype: torch.dtype, tokens: int, nan: bool = False) -> None:
    g = torch.Generator().manual_seed(tokens)
    n = -(-tokens // BS)
    src_table = torch.randperm(SRC_BLOCKS, generator=g)[:n].tolist()
    dst_table = torch.randperm(DST_BLOCKS, generator=g)[:n].tolist()
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=exporter, args=(theirs, dtype, src_table, tokens, nan))
    proc.start()
    try:
        region = msgspec.json.decode(mine.recv(), type=KvRegion)
        assert region.blocks == tuple(src_table) and region.pool_slots == SRC_BLOCKS * BS
        dest = torch.device(DEST)
        with torch.cuda.device(dest):
            before = finite(host_pool(dtype, DST_BLOCKS, 2))
            into = before.to(dest)
            caches = [(into[i, 0], into[i, 1]) for i in range(LAYERS)]
            sources = Sources()
            ok = AcrossReader(caches, BS, sources).read(region, dst_table)
            torch.cuda.synchronize()
        mine.send("done")
        got = into.cpu().view(torch.uint8)
        want = before.clone().view(torch.uint8)
        src = finite(host_pool(dtype, SRC_BLOCKS, 1)).view(torch.uint8)
        for t in range(tokens):
            s = src_table[t // BS] * BS + t % BS
            d = dst_table[t // BS] * BS + t % BS
            want[:, :, d] = src[:, :, s]
        if nan:
            assert not ok
            blocks = got.view(LAYERS, 2, DST_BLOCKS, BS, -1)
            assert not blocks[:, :, dst_table].any()  # no NaN left for a later sequence
        else:
            assert ok
            assert torch.equal(got, want)  # the prompt's slots moved, nothing else touched
        sources.close()
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("tokens", [1, 23, 200])
def test_a_sibling_pools_blocks_read_across_in_place(dtype: torch.dtype, tokens: int) -> None:
    read_across(dtype, tokens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_a_nan_read_across_is_refused_and_the_blocks_zeroed(dtype: torch.dtype) -> None:
    read_across(dtype, 70, nan=True)


def test_caches_that_are_not_one_pool_are_not_shared() -> None:
    """Separate tensors per layer: no paged region (the staged arena is the fallback)."""
    kv = host_pool(torch.bfloat16, 4, 0).cuda()
    split = [(kv[i, 0].clone(), kv[i, 1].clone()) for i in range(LAYERS)]
    assert pool_of(split) is None
    assert DevicePool.of(split, "t:3x2x64:x:bs16") is None
