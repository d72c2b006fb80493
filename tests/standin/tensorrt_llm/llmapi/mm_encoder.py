"""Stand-in `tensorrt_llm.llmapi.mm_encoder.MultimodalEncoder` (§7)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tensorrt_llm.disaggregated_params import DisaggregatedParams
from tensorrt_llm.llmapi.llm import LLM


class MultimodalEncoder(LLM):
    TOKENS_PER_IMAGE = 64

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
        if not isinstance(inputs, dict) or not inputs.get("multi_modal_data"):
            raise ValueError("MultimodalEncoder needs inputs with multi_modal_data")
        images = next(iter(inputs["multi_modal_data"].values()))
        n = len(images) * self.TOKENS_PER_IMAGE
        digest = hashlib.blake2b(repr(images).encode(), digest_size=32).digest()
        handle = {"tensor_size": [n, 4096], "standin_ipc": digest.hex()}
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
