"""Copy a sequence's KV between the paged cache and the kv_wire format (engine thread only)."""

from __future__ import annotations

import math

import torch

from trtllm_gateway.engine.disagg import kv_wire

_DTYPES = {str(t): t for t in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)}


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """An e4m3 cache moves as its bytes: gathers and index_copy_ need not support float8."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def slots_for(
    block_table: list[int], num_tokens: int, block_size: int, device: torch.device
) -> torch.Tensor:
    bt = torch.tensor(block_table, dtype=torch.long, device=device)
    offsets = torch.arange(block_size, device=device)
    return (bt.unsqueeze(1) * block_size + offsets).flatten()[:num_tokens]


def export_kv(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    slots: torch.Tensor,
    kv_layout: str,
    block_size: int,
) -> bytes:
    """Gather [layers, 2, tokens, kv_heads, head_dim] for the slots into one wire blob."""
    dtype = kv_caches[0][0].dtype
    t = torch.stack([torch.stack([_bytes_of(k)[slots], _bytes_of(v)[slots]]) for k, v in kv_caches])
    t = t.cpu().contiguous()
    data = t.view(torch.uint8).numpy().tobytes()
    header = {
        "kv_layout": kv_layout,
        "dtype": str(dtype),
        "shape": tuple(t.shape),
        "block_size": block_size,
        "num_tokens": int(slots.numel()),
    }
    return kv_wire.encode(header, data)


def decode_kv(blob: bytes, kv_layout: str) -> tuple[int, torch.Tensor]:
    """Check a wire blob against our layout; returns (num_tokens, tensor on CPU)."""
    header, data = kv_wire.decode(blob, expected_layout=kv_layout)
    dtype = _DTYPES.get(header.dtype)
    if dtype is None:
        raise kv_wire.KvWireError(f"unsupported KV dtype {header.dtype}")
    want = math.prod(header.shape) * dtype.itemsize
    if len(data) != want:
        raise kv_wire.KvWireError(
            f"KV shape {list(header.shape)} in {header.dtype} is {want} bytes, got {len(data)}"
        )
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return header.num_tokens, raw.view(dtype).view(header.shape)


def import_kv(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]], slots: torch.Tensor, kv: torch.Tensor
) -> None:
    kv = _bytes_of(kv.to(slots.device))
    for layer, (k, v) in enumerate(kv_caches):
        _bytes_of(k).index_copy_(0, slots, kv[layer, 0])
        _bytes_of(v).index_copy_(0, slots, kv[layer, 1])
