"""Encode mode (EPD) on TensorRT-LLM, over the one sibling protocol both engines speak.

An encode instance (`--engine trtllm --mode encode`) runs TensorRT-LLM's MultimodalEncoder and
answers POST /internal/v1/encode: embed_wire "pixels" frames in, one "embeds" frame per image
out. MultimodalEncoder's result is a CUDA IPC handle (`mm_embedding_handle`) that only a process
on the same node can open (llmapi/mm_encoder.py; `SharedTensorContainer.from_dict(handle).
get_local_view()`, as TensorRT-LLM's own tests and Dynamo's EPD helper read it), so the encode
instance opens it itself and sends the tensor: siblings on any host can use it.

A prefill or aggregated TensorRT-LLM instance with --encode-url sends a request's images there
and feeds the embeddings to `generate_async` as 1.2's precomputed-embeddings input,
`{"prompt": text, "multi_modal_embeddings": {"image": [tensor, ...]}}` (llmapi/llm.py ->
input_processor.attach_multimodal_embeddings). A failed sibling means "encode here" (counted).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtllm_gateway.config.disagg import EncodeSiblings
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.config.trtllm import TrtllmConfig
from trtllm_gateway.engine.disagg.embed_tensors import (
    check_finite,
    embeds_frame,
    frame_tensor,
    pixel_frames,
    request_images,
)
from trtllm_gateway.engine.disagg.encode_only import EncodeOnly
from trtllm_gateway.engine.disagg.remote_encode import RemoteEncoder
from trtllm_gateway.engine.model_source import model_display_name
from trtllm_gateway.engine.protocol import (
    EngineDeadError,
    EngineInfo,
    EngineState,
    ImageInput,
)
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.engine.trtllm.loader import import_llmapi, set_trtllm_log_level

logger = logging.getLogger(__name__)


def embeds_layout(model_dir: Path) -> str:
    """What an encode sibling's embeddings must match: TensorRT-LLM's, of this model type and
    text hidden size (attach_multimodal_embeddings checks the hidden size)."""
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config") or config
    return f"trtllm:{config.get('model_type')}:hidden={text.get('hidden_size')}"


class TrtllmEncodeEngine(EncodeOnly):
    """The Engine protocol plus ImageEncoding: no generation, only the vision encoder."""

    def __init__(
        self, engine: EngineConfig, trtllm: TrtllmConfig, *, log_level: str = "info"
    ) -> None:
        self._llmapi = import_llmapi()
        set_trtllm_log_level(log_level)
        self._model_name = engine.model
        self._trust_remote_code = trtllm.trust_remote_code
        self._model_dir = Path(engine.model)
        name = engine.served_model_name or model_display_name(engine.model)
        self.info = EngineInfo(
            model_id=name,
            max_model_len=0,
            vocab_size=0,
            eos_token_ids=(),
            supports_images=True,
            mode="encode",
            engine="trtllm",
        )
        self.tokenizer_dir: Path | None = self._model_dir
        self._encoder: Any = None
        self._prompt = ""
        self._layout = ""
        self._state: EngineState = "loading"
        self._detail = ""

    async def start(self) -> None:
        try:
            self._layout = embeds_layout(self._model_dir)
            token = Tokenizer.from_dir(self._model_dir).image_token
            if token is None:
                raise ValueError(f"{self._model_name} has no image token: not a vision model")
            self._prompt = token  # one placeholder: every encode request is one image
            self._encoder = self._llmapi.MultimodalEncoder(
                str(self._model_dir), trust_remote_code=self._trust_remote_code
            )
        except Exception as exc:
            self._state, self._detail = "dead", f"MultimodalEncoder failed to start: {exc}"
            raise EngineDeadError(self._detail) from exc
        self._state = "ready"

    async def stop(self) -> None:
        self._state = "draining"
        if self._encoder is not None:
            await asyncio.to_thread(self._encoder.shutdown)
            self._encoder = None
        self._state = "dead"

    async def encode_images(self, body: bytes) -> list[bytes]:
        """Pixel frames -> one embeds frame per image (ImageEncoding,
        routers/internal/encode.py)."""
        self._require_ready()
        frames = []
        for img in request_images(body):
            inputs = {"prompt": self._prompt, "multi_modal_data": {"image": [img.payload]}}
            result = await self._encoder.generate_async(inputs)
            tensor = self._open(result.mm_embedding_handle)
            frames.append(embeds_frame(img.hash, tensor, self._layout))
        return frames

    def _open(self, handle: dict[str, Any]) -> Any:
        shared = importlib.import_module("tensorrt_llm._torch.shared_tensor")
        view = shared.SharedTensorContainer.from_dict(handle).get_local_view()
        return view.clone().cpu()


class RemoteEmbeddings:
    """A TrtllmEngine's --encode-url client: images -> embedding tensors, or None (encode here)."""

    def __init__(self, encoders: EncodeSiblings, model_dir: Path) -> None:
        self.remote = RemoteEncoder.from_siblings(encoders)
        self._model_dir = model_dir
        self._layout = ""

    async def embed(
        self, images: Sequence[ImageInput], trace: tuple[tuple[str, str], ...] = ()
    ) -> list[Any] | None:
        if not self._layout:
            self._layout = embeds_layout(self._model_dir)
        frames = await asyncio.to_thread(pixel_frames, images)
        hashes = [img.hash for img in images]
        got = await self.remote.encode(frames, hashes, self._layout, trace, check_finite)
        return None if got is None else [frame_tensor(f) for f in got]

    async def aclose(self) -> None:
        await self.remote.aclose()
