"""EncodeEngine: the built-in engine in --mode encode (EPD): only the vision tower and projector.

It serves no generation; sibling prefill/aggregated instances POST images to
/internal/v1/encode (routers/internal/encode.py) and get their embeddings back as embed_wire frames.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin.device_dtype import pick_device, pick_dtype
from trtllm_gateway.engine.builtin.vision.embed_cache import EmbeddingCache
from trtllm_gateway.engine.builtin.vision.embedder import ImageEmbedder
from trtllm_gateway.engine.builtin.vision.encoder import load_encoder
from trtllm_gateway.engine.builtin.vision.spec import is_vision_checkpoint, language_config
from trtllm_gateway.engine.disagg.encode_only import EncodeOnly
from trtllm_gateway.engine.model_source import model_display_name, resolve_model
from trtllm_gateway.engine.protocol import (
    EngineInfo,
    EngineState,
)


class EncodeEngine(EncodeOnly):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        name = config.served_model_name or model_display_name(config.model)
        self.info = EngineInfo(
            model_id=name, max_model_len=0, vocab_size=0, eos_token_ids=(), mode="encode"
        )
        self.tokenizer_dir: Path | None = None
        self._state: EngineState = "loading"
        self._detail = ""
        self._embedder: ImageEmbedder | None = None

    async def start(self) -> None:
        try:
            self._embedder = await asyncio.to_thread(self._load)
        except Exception as e:
            self._state, self._detail = "dead", f"vision encoder failed to load: {e}"
            raise
        self._state = "ready"

    def _load(self) -> ImageEmbedder:
        s = self.config
        model_dir = resolve_model(s.model, s.cache_dir)
        if not is_vision_checkpoint(model_dir):
            raise ValueError(f"--mode encode needs a LLaVA checkpoint; {s.model} has no vision")
        self.tokenizer_dir = model_dir
        cfg = language_config(model_dir)
        self.info = replace(
            self.info,
            max_model_len=cfg.max_position_embeddings,
            vocab_size=cfg.vocab_size,
            eos_token_ids=cfg.eos_token_ids,
            supports_images=True,
        )
        device = pick_device(s.device)
        encoder = load_encoder(model_dir, pick_dtype(s.dtype, device), device)
        return ImageEmbedder(encoder, EmbeddingCache(s.vision_embed_cache_bytes))

    async def stop(self) -> None:
        self._state = "dead" if self._detail else "draining"

    async def encode_images(self, body: bytes) -> list[bytes]:
        self._require_ready()
        assert self._embedder is not None  # ready
        return await self._embedder.encode_frames(body)
