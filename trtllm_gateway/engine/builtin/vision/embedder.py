"""ImageEmbedder: ImageInputs -> embeddings (cache, then an encode sibling, then locally), and
a request's prompt expanded at its image tokens. Runs on the event loop, before admission.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import replace

import torch

from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.vision.embed_cache import EmbeddingCache
from trtllm_gateway.engine.builtin.vision.encoder import VisionEncoder
from trtllm_gateway.engine.builtin.vision.placeholders import PlacedImage, expand_prompt
from trtllm_gateway.engine.disagg.embed_tensors import (
    check_finite,
    check_layout,
    embeds_frame,
    finite_tensor,
    frame_tensor,
    pixel_frames,
    request_images,
)
from trtllm_gateway.engine.disagg.embed_wire import Frame
from trtllm_gateway.engine.disagg.remote_encode import RemoteEncoder
from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput

logger = logging.getLogger(__name__)


def create_embedder(encoder: VisionEncoder, config: BuiltinConfig) -> ImageEmbedder:
    remote = None
    if config.encoders is not None:
        remote = RemoteEncoder.from_siblings(config.encoders)
    cache = EmbeddingCache(config.engine.vision_embed_cache_bytes)
    return ImageEmbedder(encoder, cache, remote)


class ImageEmbedder:
    def __init__(
        self, encoder: VisionEncoder, cache: EmbeddingCache, remote: RemoteEncoder | None = None
    ) -> None:
        self.encoder = encoder
        self.cache = cache
        self.remote = remote
        self.layout = encoder.spec.layout
        self._lock = threading.Lock()  # one local encode at a time on the device

    async def prepare(
        self, req: GenerateRequest, max_model_len: int
    ) -> tuple[GenerateRequest, tuple[PlacedImage, ...]]:
        """The request with each image token expanded to its embedding rows, and the rows.

        The gateway sized max_tokens on the unexpanded prompt, so it is capped at the context
        the expanded prompt leaves (finish_reason "length" at the cap, as at max_model_len).
        """
        embeds = await self.embed(req.images, req.trace_headers)
        token = self.encoder.spec.image_token_id
        ids, placed = expand_prompt(req.prompt_token_ids, token, embeds)
        sp = req.sampling
        room = max_model_len - len(ids)
        if 0 < room < sp.max_tokens:
            sp = replace(sp, max_tokens=room, min_tokens=min(sp.min_tokens, room))
        return replace(req, prompt_token_ids=tuple(ids), sampling=sp), placed

    async def embed(
        self, images: Sequence[ImageInput], trace: tuple[tuple[str, str], ...] = ()
    ) -> list[torch.Tensor]:
        out: list[torch.Tensor | None] = [
            self._given(img) if isinstance(img.payload, Frame) else self.cache.get(img.hash)
            for img in images
        ]
        todo = [img for img, e in zip(images, out, strict=True) if e is None]
        if todo:
            fresh = await self._remote(todo, trace) if self.remote is not None else None
            if fresh is None:
                fresh = await asyncio.to_thread(self.encode_local, todo)
            it = iter(fresh)
            for i, (img, e) in enumerate(zip(images, out, strict=True)):
                if e is None:
                    out[i] = next(it)
                    self.cache.put(img.hash, out[i])  # type: ignore[arg-type]
        return [e for e in out if e is not None]

    async def aclose(self) -> None:
        if self.remote is not None:
            await self.remote.aclose()

    def _given(self, img: ImageInput) -> torch.Tensor:
        """A precomputed embedding (an image_embeds part): it must be this encoder's layout."""
        frame = img.payload
        assert isinstance(frame, Frame)
        check_layout(frame, self.layout)
        return finite_tensor(frame).to(self.encoder.device, self.encoder.dtype)

    def encode_local(self, images: Sequence[ImageInput]) -> list[torch.Tensor]:
        with self._lock:
            return self.encoder.encode([img.payload for img in images])

    async def _remote(
        self, images: Sequence[ImageInput], trace: tuple[tuple[str, str], ...]
    ) -> list[torch.Tensor] | None:
        assert self.remote is not None
        frames = await asyncio.to_thread(pixel_frames, images)
        hashes = [img.hash for img in images]
        # Shapes and dtypes are checked against our layout as the frames are decoded.
        got = await self.remote.encode(frames, hashes, self.layout, trace, check_finite)
        if got is None:
            return None
        dev, dtype = self.encoder.device, self.encoder.dtype
        return [frame_tensor(f).to(dev, dtype) for f in got]

    # --- encode mode: the sibling side ----------------------------------------------------
    async def encode_frames(self, body: bytes) -> list[bytes]:
        """An encode request's pixel frames -> one embeds frame per image (same order)."""
        images = request_images(body)
        embeds = await self.embed(images)
        return [
            embeds_frame(img.hash, e, self.layout) for img, e in zip(images, embeds, strict=True)
        ]
