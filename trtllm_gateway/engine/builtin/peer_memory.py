"""A sibling core's GPU allocation mapped into this core's device, to be read by our kernels.

torch opens a shared CUDA storage on the device it was made on (rebuild_cuda_tensor,
torch/multiprocessing/reductions.py, guards that device before cudaIpcOpenMemHandle): in a
decode core on cuda:1 the prefill core's cuda:0 pool is mapped in cuda:0's context only, and a
cuda:1 kernel reading it faults (an illegal address; measured on two H200, 2026-11-27). Here
the handle is opened with cudaIpcOpenMemHandle(..., cudaIpcMemLazyEnablePeerAccess) while this
core's device is current, so the mapping lives in its context: one kernel of ours reads the
sibling's blocks across NVLink (359 GB/s of a 367 GB/s copy-engine peer copy, same probe) and
no context is made on the sibling's GPU.

The handle is the one torch's UntypedStorage._share_cuda_() returns. Its format is torch's
(c10/cuda/CUDACachingAllocator.cpp, shareIpcHandle): a version byte, a type byte, then for type
'c' (a cudaMalloc block) the 64-byte cudaIpcMemHandle_t. torch 2.13 moved the version from 2 to
3 without changing the 'c' payload; an expandable segment ('e') is a different handle, refused.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from trtllm_gateway.engine.kv_region import CudaIpcHandle, KvRegionError

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
_CUDA_MALLOC = ord("c")
_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess
_CUDARTS = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")  # torch has one loaded


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


def mem_handle(h: CudaIpcHandle) -> bytes:
    """The cudaIpcMemHandle_t inside a torch storage handle. Raises KvRegionError."""
    try:
        raw = bytes.fromhex(h.handle)
    except ValueError:
        raise KvRegionError("the CUDA IPC handle is not hex") from None
    if len(raw) != 2 + IPC_HANDLE_BYTES or raw[1] != _CUDA_MALLOC:
        kind = chr(raw[1]) if len(raw) > 1 else "?"
        raise KvRegionError(
            f"a CUDA IPC handle of type {kind!r} and {len(raw)} bytes: only a cudaMalloc block "
            "('c', 66 bytes) can be mapped (is PYTORCH_CUDA_ALLOC_CONF expandable_segments on?)"
        )
    return raw[2:]


def _cudart() -> ctypes.CDLL:
    for name in _CUDARTS:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise KvRegionError("no CUDA runtime library to open a CUDA IPC handle with")


class PeerMappings:
    """Sibling allocations opened on this core's device, one per sibling GPU, closed at close().

    A mapping keeps its allocation alive after the process that made it has exited (CUDA IPC:
    the memory is freed once every importer has closed it), so a prefill sibling restarted on
    the same GPU would find its old pool still there, held by us: the mapping of a GPU's
    earlier allocation is closed when another allocation of that GPU is opened. Two siblings
    sharing one GPU then reopen each other's pool in turn (correct, a little slower). Call
    open() from the one thread that reads the mappings (the transfer thread): no read of the
    closed mapping is in flight then."""

    def __init__(self, lib: Any = None) -> None:
        self._open: dict[int, tuple[str, int]] = {}  # sibling GPU -> (handle, base)
        self._lock = threading.Lock()
        self._lib = lib

    def open(self, h: CudaIpcHandle, device: int) -> int:
        """The address, in `device`'s context, of the allocation's byte h.offset."""
        with self._lock:
            held = self._open.get(h.device)
            if held is not None and held[0] == h.handle:
                return held[1] + h.offset
            handle = _IpcHandle()
            ctypes.memmove(ctypes.byref(handle), mem_handle(h), IPC_HANDLE_BYTES)
            if self._lib is None:
                self._lib = _cudart()
            self._lib.cudaSetDevice(device)  # the runtime torch runs on: already current
            if held is not None:
                del self._open[h.device]
                self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(held[1]))
            ptr = ctypes.c_void_p()
            lazy = _LAZY_ENABLE_PEER_ACCESS
            err = self._lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), handle, lazy)
            if err != 0 or not ptr.value:
                raise KvRegionError(f"cudaIpcOpenMemHandle failed (cudaError {err})")
            self._open[h.device] = (h.handle, int(ptr.value))
            return int(ptr.value) + h.offset

    def close(self) -> None:
        with self._lock:
            if self._lib is not None:
                for _, base in self._open.values():
                    self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(base))
            self._open.clear()
