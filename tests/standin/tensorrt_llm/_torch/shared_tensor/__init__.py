"""Stand-in `tensorrt_llm._torch.shared_tensor.SharedTensorContainer` (1.2 period).

MultimodalEncoder hands out `mm_embedding_handle` dicts; the real container rebuilds the tensor
from a CUDA IPC handle, which only a process on the same node can open (Dynamo moves embeddings
across hosts with NIXL instead). Here the tensors live in a process-local registry: a handle
from another process (or one already released) fails as the real one would.
"""

from __future__ import annotations

from typing import Any

_REGISTRY: dict[str, Any] = {}


def register(key: str, tensor: Any) -> dict[str, Any]:
    """What the stand-in encoder stores and returns as the handle dict."""
    _REGISTRY[key] = tensor
    return {
        "method": "cuda_ipc",
        "standin_key": key,
        "tensor_size": list(tensor.shape),
        "dtype": str(tensor.dtype).removeprefix("torch."),
    }


class SharedTensorContainer:
    def __init__(self, key: str) -> None:
        self._key = key

    @classmethod
    def from_dict(cls, handle: dict[str, Any]) -> SharedTensorContainer:
        return cls(str(handle["standin_key"]))

    def get_local_view(self) -> Any:
        tensor = _REGISTRY.get(self._key)
        if tensor is None:
            raise RuntimeError("cannot open the CUDA IPC handle in this process")
        return tensor
