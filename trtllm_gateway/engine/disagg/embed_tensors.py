"""embed_wire frames <-> images and torch tensors: the torch side both engines' EPD paths share.

embed_wire.py stays free of torch; an encode instance (built-in or TensorRT-LLM) and the
prefill/aggregated side that asks it convert through these functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trtllm_gateway.engine.disagg.embed_wire import (
    EmbedWireError,
    Frame,
    check_embeds,
    decode_frames,
    encode_frame,
)
from trtllm_gateway.engine.protocol import ImageInput, InvalidRequestError

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


def pixel_frames(images: Sequence[ImageInput]) -> list[bytes]:
    """One uint8 RGB [height, width, 3] "pixels" frame per image (payload: a PIL image)."""
    out = []
    for img in images:
        pil: Any = img.payload
        rgb = pil if pil.mode == "RGB" else pil.convert("RGB")
        w, h = rgb.size
        out.append(encode_frame("pixels", img.hash, "uint8", (h, w, 3), rgb.tobytes()))
    return out


def frame_image(frame: Frame) -> ImageInput:
    """A "pixels" frame back to an ImageInput; ValueError unless it is RGB."""
    from PIL import Image

    h, w, c = frame.header.shape
    if c != 3:
        raise ValueError("pixels must be RGB")
    pil = Image.frombytes("RGB", (w, h), bytes(frame.data))
    return ImageInput(hash=frame.header.image_hash, payload=pil)


def embeds_frame(image_hash: str, embeds: torch.Tensor, layout: str) -> bytes:
    """One image's embedding rows [tokens, hidden] as an "embeds" frame (float32 if exotic)."""
    cpu = embeds.detach().contiguous().cpu()
    if cpu.dtype not in DTYPE_NAMES:
        cpu = cpu.to(torch.float32)
    raw = cpu.view(torch.uint8).numpy().tobytes()
    return encode_frame("embeds", image_hash, DTYPE_NAMES[cpu.dtype], tuple(cpu.shape), raw, layout)


def frame_tensor(frame: Frame) -> torch.Tensor:
    """An "embeds" frame as a CPU tensor; InvalidRequestError for a dtype we do not take."""
    dtype = DTYPES.get(frame.header.dtype)
    if dtype is None:
        raise InvalidRequestError(f"embeddings of dtype {frame.header.dtype} are not supported")
    return torch.frombuffer(bytearray(frame.data), dtype=dtype).view(frame.header.shape)


def request_images(body: bytes) -> list[ImageInput]:
    """An encode request's images; InvalidRequestError for a malformed or empty body."""
    try:
        images = [frame_image(f) for f in decode_frames(body, "pixels")]
    except ValueError as e:  # EmbedWireError, or pixels that do not make an image
        raise InvalidRequestError(f"bad encode request: {e}") from None
    if not images:
        raise InvalidRequestError("an encode request needs at least one image")
    return images


def check_layout(frame: Frame, layout: str) -> None:
    """A precomputed embedding is usable only by an encoder of its layout, and only in the
    shape and dtype that layout's model takes (check_embeds): a 400 otherwise."""
    if frame.header.layout != layout:
        raise InvalidRequestError(
            f"image_embeds of layout {frame.header.layout!r} do not fit this model's vision "
            f"layout {layout!r}",
            param="messages",
        )
    try:
        check_embeds(frame.header, layout)
    except EmbedWireError as e:
        raise InvalidRequestError(f"image_embeds refused: {e}", param="messages") from None


def check_finite(frames: Sequence[Frame]) -> None:
    """An encode sibling's embeddings hold only finite values (EmbedWireError: its fault)."""
    for frame in frames:
        if not bool(torch.isfinite(frame_tensor(frame)).all()):
            raise EmbedWireError(f"embeddings for {frame.header.image_hash} hold NaN or inf")


def finite_tensor(frame: Frame) -> torch.Tensor:
    """frame_tensor, refused (InvalidRequestError) unless every value is finite: a NaN row
    would reach the KV cache and every token sampled after it."""
    tensor = frame_tensor(frame)
    if not bool(torch.isfinite(tensor).all()):
        raise InvalidRequestError("image_embeds hold NaN or infinite values", param="messages")
    return tensor
