"""Stand-in `tensorrt_llm.llmapi.mm_encoder.MultimodalEncoder` (§7).

Real (llmapi/mm_encoder.py, 1.2 period): a `_TorchLLM` with `mm_encoder_only=True` and
`max_num_tokens` 16384 by default; `generate_async(inputs)` takes a TextPrompt
(`{"prompt": str, "multi_modal_data": {"image": [...]}}`) and its result carries the vision
embedding of all the prompt's images as `mm_embedding_handle` (a CUDA IPC handle dict with
`tensor_size` [tokens, hidden]), also in `disaggregated_params.multimodal_embedding_handles`
with 8-int `multimodal_hashes`. SharedTensorContainer opens the handle on the same node only.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

from tensorrt_llm import _scripted
from tensorrt_llm._torch.shared_tensor import register
from tensorrt_llm.disaggregated_params import DisaggregatedParams
from tensorrt_llm.llmapi.llm import LLM, image_pixels

_KEYS = itertools.count()


class MultimodalEncoder(LLM):
    TOKENS_PER_IMAGE = 4

    def __init__(
        self,
        model: str | Path,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_num_tokens", 16384)
        super().__init__(
            model,
            trust_remote_code=trust_remote_code,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            mm_encoder_only=True,
            **kwargs,
        )

    def generate_async(self, inputs: Any, sampling_params: Any = None) -> Any:  # type: ignore[override]
        if self._shutdown:
            raise RuntimeError("LLM is shutting down")
        if not isinstance(inputs, dict) or not inputs.get("multi_modal_data"):
            raise ValueError("MultimodalEncoder needs inputs with multi_modal_data")
        if not isinstance(inputs.get("prompt"), str):
            raise ValueError("MultimodalEncoder needs a text prompt with the image placeholders")
        images = inputs["multi_modal_data"].get("image") or []
        import torch

        parts = [
            _scripted.image_embedding(image_pixels(img), self.TOKENS_PER_IMAGE, self._hidden)
            for img in images
        ]
        embedding = torch.cat(parts)  # type: ignore[arg-type]
        handle = register(f"mm-{next(_KEYS)}", embedding)
        digest = hashlib.blake2b(
            b"".join(image_pixels(img) for img in images), digest_size=32
        ).digest()
        hashes = [[int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4)]]
        return _EncoderResult(
            handle,
            DisaggregatedParams(
                request_type="context_only",
                multimodal_embedding_handles=[handle],
                multimodal_hashes=hashes,
            ),
        )


class _EncoderResult:
    def __init__(self, handle: dict[str, Any], params: DisaggregatedParams) -> None:
        self.mm_embedding_handle = handle
        self.disaggregated_params = params
        self.finished = True
        self.outputs: list[Any] = []

    async def aresult(self) -> _EncoderResult:
        return self

    def __await__(self) -> Any:
        return self.aresult().__await__()
