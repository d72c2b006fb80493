"""The KV staging arenas of one core, and the gather and scatter between them and the paged cache.

    HostArena     one shared-memory segment (tgkv_*): the CPU transport, and the HTTP path's
                  host staging (pinned with cudaHostRegister on CUDA, where that works)
    DeviceArena   one buffer on the core's GPU; its CUDA IPC handle is taken once and opened
                  once per peer (open_ipc), so a hand-off carries an offset, never a handle

gather() writes a sequence's prompt KV as [layers, 2, tokens, kv_heads, head_dim] into a region
and scatter() is its inverse: on a GPU one Triton kernel for every layer (kernels/kv_blocks.py),
on the CPU one numpy take / put per layer and K/V (no per-block Python). scatter_checked() is
the decode side's: finite values only. The CUDA-only parts (DeviceArena, open_ipc, the kernel)
run in tests/gpu; everything else runs on CPU tests.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

from trtllm_gateway.engine.builtin.backend import KvCaches
from trtllm_gateway.engine.builtin.peer_memory import PeerMappings
from trtllm_gateway.engine.kv_region import (
    CudaIpcHandle,
    HostArenas,
    KvRegion,
    KvRegionError,
    RegionAllocator,
    ShmArena,
)

logger = logging.getLogger(__name__)

_DTYPES = {str(t): t for t in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)}


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    """An e4m3 cache moves as its bytes: gathers and index_copy_ need not support float8."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def as_kv(raw: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A region's uint8 bytes as the [layers, 2, tokens, heads, dim] cache-dtype tensor."""
    return raw.view(dtype).view(shape)


def gather(caches: KvCaches, block_table: list[int], block_size: int, dst: torch.Tensor) -> None:
    """dst [layers, 2, tokens, heads, dim] (contiguous, any device) <- the prompt's blocks.

    Whole blocks move as rows (one index op per layer and K/V, no per-block Python); the
    last, partial block is one slice. A GPU cache gathers on the GPU, then one copy down."""
    tokens = dst.shape[2]
    if dst.device != caches[0][0].device:
        staged = torch.empty(dst.shape, dtype=dst.dtype, device=caches[0][0].device)
        gather(caches, block_table, block_size, staged)
        bytes_of(dst).copy_(bytes_of(staged), non_blocking=True)
        return
    if dst.device.type == "cuda" and _one_launch(caches, block_table, block_size, dst, False):
        return
    full, tail = divmod(tokens, block_size)
    last = block_table[full] * block_size if tail else 0
    if dst.device.type == "cpu":  # numpy: no thread-pool round per op (2-core figures: bench)
        ids = np.asarray(block_table[:full], dtype=np.int64)
        for layer, kv in enumerate(caches):
            for j, src in enumerate(kv):
                cache, out = _np_rows(src, block_size), _np(dst[layer, j])
                head = out[: full * block_size].reshape(full, cache.shape[1])
                np.take(cache, ids, axis=0, out=head)
                out[full * block_size :] = _np(src)[last : last + tail]
        return
    idx = torch.tensor(block_table[:full], dtype=torch.long).to(dst.device, non_blocking=True)
    for layer, kv in enumerate(caches):
        for j, src in enumerate(kv):
            rows = bytes_of(src).view(-1, block_size * src[0].numel())
            into = bytes_of(dst[layer, j])
            if full:
                torch.index_select(rows, 0, idx, out=into[: full * block_size].view(full, -1))
            into[full * block_size :].copy_(bytes_of(src)[last : last + tail])


def scatter(caches: KvCaches, block_table: list[int], block_size: int, src: torch.Tensor) -> None:
    """The reserved blocks <- src [layers, 2, tokens, heads, dim] (on the cache's device)."""
    tokens = src.shape[2]
    if src.device.type == "cuda" and _one_launch(caches, block_table, block_size, src, True):
        return
    full, tail = divmod(tokens, block_size)
    last = block_table[full] * block_size if tail else 0
    if src.device.type == "cpu":
        ids = np.asarray(block_table[:full], dtype=np.int64)
        for layer, kv in enumerate(caches):
            for j, dst in enumerate(kv):
                rows, data = _np_rows(dst, block_size), _np(src[layer, j])
                rows[ids] = data[: full * block_size].reshape(full, rows.shape[1])
                _np(dst)[last : last + tail] = data[full * block_size :]
        return
    idx = torch.tensor(block_table[:full], dtype=torch.long).to(src.device, non_blocking=True)
    for layer, kv in enumerate(caches):
        for j, dst in enumerate(kv):
            into = bytes_of(dst).view(-1, block_size * dst[0].numel())
            part = bytes_of(src[layer, j])
            if full:
                into.index_copy_(0, idx, part[: full * block_size].view(full, -1))
            bytes_of(dst)[last : last + tail].copy_(part[full * block_size :])


def pool_of(caches: KvCaches) -> torch.Tensor | None:
    """The one [layers, 2, slots, heads, dim] tensor the caches are views of (the loader's),
    or None when they are separate tensors."""
    base = caches[0][0]
    plane = base.numel() * base.element_size()
    if (
        base.untyped_storage().nbytes()
        < base.storage_offset() * base.element_size() + 2 * len(caches) * plane
    ):
        return None  # separate tensors, however the allocator happened to place them
    for i, kv in enumerate(caches):
        for j, t in enumerate(kv):
            at = base.data_ptr() + (2 * i + j) * plane
            if t.data_ptr() != at or not t.is_contiguous() or t.shape != base.shape:
                return None
    n = base.numel()
    return base.as_strided((len(caches), 2, *base.shape), (2 * n, n, *base.stride()))


def _one_launch(
    caches: KvCaches,
    block_table: list[int],
    block_size: int,
    region: torch.Tensor,
    to_pool: bool,
    bad: torch.Tensor | None = None,
) -> bool:
    """A GPU pool's whole hand-off as one Triton kernel (kernels/kv_blocks.py; with bad, the
    NaN/infinity count of a scatter); False when the caches are not one pool or the row is not
    whole 32-bit words (the per-layer path then)."""
    pool = pool_of(caches)
    if pool is None or not whole_words(caches) or not region.is_contiguous():
        return False
    from trtllm_gateway.engine.builtin.kernels.kv_blocks import move  # imports Triton

    table = table_on(block_table, region.shape[2], block_size, region.device)
    move(pool, region, table, block_size, to_pool, bad)
    return True


def scatter_checked(
    caches: KvCaches, block_table: list[int], block_size: int, src: torch.Tensor
) -> bool:
    """scatter() a sibling's KV (any device) if it is all finite; False, and the blocks
    unwritten or zeroed, when it is not. The one copy across (peer GPU or host to this GPU)
    comes first; then a GPU pool checks and scatters in one kernel, else all_finite and
    scatter. (Triton refuses a peer GPU's IPC pointer: 'cannot be accessed from Triton', so
    the region is not read in place.)"""
    device = caches[0][0].device
    if src.device != device:
        src = src.to(device, non_blocking=True)
    bad = torch.zeros(1, dtype=torch.int32, device=device) if device.type == "cuda" else None
    if bad is not None and _one_launch(caches, block_table, block_size, src, True, bad):
        if int(bad.item()) == 0:
            return True
        pool = pool_of(caches)
        assert pool is not None
        ids = torch.tensor(block_table, dtype=torch.long, device=device)
        blocks = pool.view(*pool.shape[:2], -1, block_size, *pool.shape[3:])
        blocks.view(torch.uint8)[:, :, ids] = 0  # no NaN left for a later sequence's masked slots
        return False
    if not all_finite(src):
        return False
    scatter(caches, block_table, block_size, src)
    return True


def whole_words(caches: KvCaches) -> bool:
    """The cache's rows are whole 32-bit words (what the kernel moves)."""
    return caches[0][0].shape[-1] * caches[0][0].element_size() % 4 == 0


def table_on(
    block_table: list[int], tokens: int, block_size: int, device: torch.device
) -> torch.Tensor:
    blocks = -(-tokens // block_size)
    return torch.tensor(block_table[:blocks], dtype=torch.int32).to(device, non_blocking=True)


def _np(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's bytes as a [rows, bytes a row] array, in place."""
    flat = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return flat.numpy().reshape(t.shape[0], -1)


def _np_rows(cache: torch.Tensor, block_size: int) -> np.ndarray:
    return _np(cache).reshape(-1, block_size * _np(cache).shape[1])


def all_finite(kv: torch.Tensor) -> bool:
    """No NaN or infinity (a sibling's KV must not reach the prefix cache: issue 40). One pass
    of torch.aminmax: NaN propagates to both ends, +inf is the max, -inf the min (a float32 sum
    of a bf16 tensor took 18x longer on CPU: 211 vs 12 ms for an 8B prompt's 256 MiB)."""
    if kv.dtype == torch.float8_e4m3fn:  # no infinity; NaN is S.1111.111
        return not bool(((kv.view(torch.uint8) & 0x7F) == 0x7F).any())
    if kv.numel() == 0:
        return True
    lo, hi = torch.aminmax(kv)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def dtype_of(name: str) -> torch.dtype:
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise KvRegionError(f"unsupported KV dtype {name}")
    return dtype


class HostArena:
    """A shared-memory segment this core creates, stages into and unlinks at close."""

    transport = "shm"

    def __init__(self, size: int, pin: bool) -> None:
        self.shm = ShmArena(size)
        self.name, self.token, self.alloc = self.shm.name, self.shm.token, self.shm.alloc
        self.bytes = torch.frombuffer(self.shm.buf, dtype=torch.uint8)
        self.pinned = pin and _pin(self.bytes)

    def region(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.bytes[offset : offset + nbytes]

    def describe(self, offset: int, kv: tuple[tuple[int, ...], str, str]) -> KvRegion:
        shape, dtype, layout = kv
        nbytes = nbytes_of(shape, dtype)
        return KvRegion(
            transport="shm", arena=self.name, offset=offset, nbytes=nbytes, shape=shape,
            dtype=dtype, kv_layout=layout,
        )  # fmt: skip

    def close(self) -> None:
        if self.pinned:
            cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            cudart.cudaHostUnregister(self.bytes.data_ptr())
        del self.bytes
        self.shm.close()


class DeviceArena:
    """A buffer on the core's GPU shared once over CUDA IPC (cuda_ipc)."""

    transport = "cuda_ipc"

    def __init__(self, size: int, device: torch.device) -> None:
        self.bytes = torch.empty(size, dtype=torch.uint8, device=device)
        self.alloc = RegionAllocator(size)
        self.ipc = share_storage(self.bytes.untyped_storage())  # the arena starts its storage
        self.name = self.ipc.handle[:32]

    def region(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.bytes[offset : offset + nbytes]

    def describe(self, offset: int, kv: tuple[tuple[int, ...], str, str]) -> KvRegion:
        shape, dtype, layout = kv
        return KvRegion(
            transport="cuda_ipc", arena=self.name, offset=offset, nbytes=nbytes_of(shape, dtype),
            shape=shape, dtype=dtype, kv_layout=layout, ipc=self.ipc,
        )  # fmt: skip

    def close(self) -> None:
        del self.bytes


class Sources:
    """Regions of other processes' arenas, opened once each (the decode side's copy source).
    pin: a CUDA core page-locks each host arena once (cudaHostRegister) so its copies up are
    pinned: a sibling's shm arena, or its own API server's receive arena (the HTTP path)."""

    def __init__(self, pin: bool = False) -> None:
        self.host = HostArenas()
        self.pin = pin
        self._ipc: dict[str, torch.Tensor] = {}
        self.peers = PeerMappings()  # sibling pools mapped in this GPU's context (kv_across)
        self._pinned: dict[str, torch.Tensor | None] = {}  # host arenas page-locked, by name
        self._lock = threading.Lock()

    def tensor(self, region: KvRegion) -> torch.Tensor:
        """The region's bytes in place (shared memory, or the peer GPU's arena)."""
        if region.transport == "shm":
            view = self.host.view(region)  # checks the name and the range
            whole = self._pin(region.arena) if self.pin else None
            if whole is None:
                return torch.frombuffer(view, dtype=torch.uint8)
            return whole[region.offset : region.offset + region.nbytes]
        if region.transport == "cuda_ipc" and region.ipc is not None:
            with self._lock:
                arena = self._ipc.get(region.ipc.handle)
                if arena is None:  # one arena a sibling GPU: a restarted sibling's old one
                    for old in [
                        k for k, t in self._ipc.items() if t.device.index == region.ipc.device
                    ]:
                        del self._ipc[old]  # closed with its last tensor (PeerMappings says why)
                    arena = self._ipc[region.ipc.handle] = open_ipc(region.ipc)
            end = region.offset + region.nbytes
            if region.offset < 0 or end > arena.numel():
                raise KvRegionError(f"KV region [{region.offset}, {end}) is outside the arena")
            return arena[region.offset : end]
        raise KvRegionError(f"unknown KV transport {region.transport!r}")

    def _pin(self, name: str) -> torch.Tensor | None:
        with self._lock:
            if name not in self._pinned:
                buf = self.host.segment(name).buf
                assert buf is not None
                whole = torch.frombuffer(buf, dtype=torch.uint8)
                self._pinned[name] = whole if _pin(whole) else None
            return self._pinned[name]

    def close(self) -> None:
        with self._lock:
            for whole in self._pinned.values():
                if whole is not None:
                    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
                    cudart.cudaHostUnregister(whole.data_ptr())
            self._pinned.clear()
        self.peers.close()


def nbytes_of(shape: tuple[int, ...], dtype: str) -> int:
    n = dtype_of(dtype).itemsize
    for d in shape:
        n *= d
    return n


def _pin(t: torch.Tensor) -> bool:
    """Page-lock a host arena for the GPU's copies (pinned staging for the HTTP path)."""
    if not torch.cuda.is_available():
        return False
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    err = cudart.cudaHostRegister(t.data_ptr(), t.numel(), 0)
    if int(err) != 0:
        logger.warning("KV host arena not pinned (cudaHostRegister: %s); pageable copies", err)
        return False
    return True


def share_storage(storage: torch.UntypedStorage) -> CudaIpcHandle:
    """The IPC handle of a storage's allocation, taken once (torch/multiprocessing/reductions.py,
    reduce_tensor, calls the same _share_cuda_ on the tensor's storage)."""
    dev, handle, size, offset, rc_handle, rc_offset, ev_handle, ev_sync = storage._share_cuda_()  # type: ignore[no-untyped-call]
    return CudaIpcHandle(
        device=int(dev), handle=bytes(handle).hex(), size=int(size), offset=int(offset),
        ref_counter_handle=bytes(rc_handle).hex(), ref_counter_offset=int(rc_offset),
        event_handle=bytes(ev_handle or b"").hex(), event_sync_required=bool(ev_sync),
    )  # fmt: skip


def open_ipc(h: CudaIpcHandle) -> torch.Tensor:
    """A peer core's device arena as a uint8 tensor on its GPU (torch's rebuild_cuda_tensor,
    torch/multiprocessing/reductions.py, opens a shared storage the same way). Both processes
    must see the arena's GPU under the same index: no CUDA_VISIBLE_DEVICES isolation."""
    torch.cuda._lazy_init()  # type: ignore[no-untyped-call]
    storage = torch.UntypedStorage._new_shared_cuda(
        h.device, bytes.fromhex(h.handle), h.size, h.offset,
        bytes.fromhex(h.ref_counter_handle), h.ref_counter_offset,
        bytes.fromhex(h.event_handle), h.event_sync_required,
    )  # fmt: skip
    out = torch.empty(0, dtype=torch.uint8, device=f"cuda:{h.device}")
    return out.set_(storage, 0, (h.size,), (1,))
