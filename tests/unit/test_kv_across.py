"""The CPU-checkable half of the paged GPU hand-off (engine/builtin/kv_across.py,
peer_memory.py): which torch IPC handles can be mapped, and a sibling's paged region refused
before any kernel reads outside its pool. The reads across themselves: tests/gpu/test_kv_across.py.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from trtllm_gateway.engine.builtin.kv_across import check_paged
from trtllm_gateway.engine.builtin.peer_memory import IPC_HANDLE_BYTES, PeerMappings, mem_handle
from trtllm_gateway.engine.kv_region import CudaIpcHandle, KvRegion, KvRegionError

BS = 16
PAYLOAD = bytes(range(IPC_HANDLE_BYTES))


def handle(raw: bytes, size: int = 1 << 30) -> CudaIpcHandle:
    return CudaIpcHandle(
        device=0, handle=raw.hex(), size=size, offset=0, ref_counter_handle="",
        ref_counter_offset=0, event_handle="", event_sync_required=False,
    )  # fmt: skip


@pytest.mark.parametrize("version", [2, 3])
def test_a_cuda_malloc_handle_of_torchs_format_gives_its_ipc_handle(version: int) -> None:
    """c10/cuda/CUDACachingAllocator.cpp, shareIpcHandle: [version][type 'c'][64 bytes]; torch
    2.13 moved the version byte from 2 to 3 with the same payload."""
    assert mem_handle(handle(bytes([version]) + b"c" + PAYLOAD)) == PAYLOAD


@pytest.mark.parametrize(
    "raw",
    [
        b"\x02e" + PAYLOAD,  # an expandable segment: another kind of handle
        b"\x02c" + PAYLOAD[:-1],  # short
        b"\x02c" + PAYLOAD + b"\x00",  # long
        b"",
    ],
)
def test_other_handles_are_refused(raw: bytes) -> None:
    with pytest.raises(KvRegionError):
        mem_handle(handle(raw))


def test_a_handle_that_is_not_hex_is_refused() -> None:
    bad = msgspec.structs.replace(handle(b"\x02c" + PAYLOAD), handle="zz")
    with pytest.raises(KvRegionError):
        mem_handle(bad)


def paged(tokens: int, blocks: tuple[int, ...], **kw: object) -> KvRegion:
    layers, heads, dim, itemsize = 2, 2, 64, 2
    row = heads * dim * itemsize
    slots = int(kw.pop("pool_slots", 64 * BS))  # type: ignore[call-overload]
    size = int(kw.pop("size", 2 * layers * slots * row))  # type: ignore[call-overload]
    fields: dict[str, object] = {
        "transport": "cuda_ipc", "arena": "x", "offset": 0,
        "nbytes": 2 * layers * tokens * row, "shape": (layers, 2, tokens, heads, dim),
        "dtype": "torch.bfloat16", "kv_layout": "t", "ipc": handle(b"\x02c" + PAYLOAD, size),
        "blocks": blocks, "pool_slots": slots,
    }  # fmt: skip
    fields.update(kw)
    return msgspec.convert(fields, KvRegion)


def test_a_paged_region_inside_its_pool_passes() -> None:
    check_paged(paged(33, (0, 5, 63)), BS)


@pytest.mark.parametrize(
    ("region", "why"),
    [
        (paged(33, (0, 5)), "2 blocks for 33 tokens"),
        (paged(33, (0, 5, 63, 1)), "4 blocks for 33 tokens"),
        (paged(33, (0, 5, 64)), "outside the sibling pool's 64 blocks"),
        (paged(33, (0, -1, 3)), "outside the sibling pool's 64 blocks"),
        (paged(33, (0, 5, 6), size=1 << 16), "outside its allocation"),
        (paged(33, (0, 5, 6), offset=-4096), "outside its allocation"),
        (paged(33, (0, 5, 6), offset=4096), "outside its allocation"),  # pool runs past the end
        (paged(33, (0, 5, 6), ipc=None), "needs a CUDA IPC handle"),
        (paged(33, (0, 5, 6), transport="shm"), "needs a CUDA IPC handle"),
    ],
)
def test_a_paged_region_reaching_outside_its_pool_is_refused(region: KvRegion, why: str) -> None:
    with pytest.raises(KvRegionError, match=why.replace("(", r"\(").replace("'", ".")):
        check_paged(region, BS)


class FakeCudart:
    """cudaIpcOpenMemHandle / cudaIpcCloseMemHandle as calls recorded (the real ones run in
    tests/gpu/test_kv_across.py): what PeerMappings keeps open, and when it closes."""

    def __init__(self) -> None:
        self.opened: list[bytes] = []
        self.closed: list[int] = []
        self.next = 0x7F0000000000

    def cudaSetDevice(self, device: int) -> int:
        return 0

    def cudaIpcOpenMemHandle(self, ptr: Any, handle: Any, flags: int) -> int:
        assert flags == 1  # cudaIpcMemLazyEnablePeerAccess
        self.opened.append(bytes(handle.reserved))
        self.next += 1 << 30
        ptr._obj.value = self.next
        return 0

    def cudaIpcCloseMemHandle(self, ptr: Any) -> int:
        self.closed.append(ptr.value)
        return 0


def on(device: int, payload: bytes) -> CudaIpcHandle:
    return msgspec.structs.replace(handle(b"\x02c" + payload), device=device, offset=512)


def test_a_restarted_siblings_old_pool_is_closed_when_its_new_one_opens() -> None:
    """CUDA IPC keeps an allocation alive while an importer holds it: a prefill sibling
    restarted on the same GPU must not find its old pool still held by the decode core."""
    lib = FakeCudart()
    maps = PeerMappings(lib)
    a, b, c = (bytes([i]) * IPC_HANDLE_BYTES for i in (1, 2, 3))
    first = maps.open(on(0, a), 1)
    assert maps.open(on(0, a), 1) == first and len(lib.opened) == 1  # opened once
    other_gpu = maps.open(on(2, c), 1)  # another sibling, another GPU: both stay open
    assert lib.closed == []
    again = maps.open(on(0, b), 1)  # GPU 0's sibling restarted: its old pool is let go
    assert lib.closed == [first - 512] and again != first
    maps.close()
    assert sorted(lib.closed) == sorted([first - 512, other_gpu - 512, again - 512])
