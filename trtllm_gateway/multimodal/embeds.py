"""Precomputed image embeddings from clients: an `image_embeds` chat part's bytes -> ImageInput.

The file is one embed_wire "embeds" frame, the very bytes an encode sibling answers with
(engine/disagg/embed_wire.py: header with dtype, [tokens, hidden] shape, BLAKE3 checksum and the
vision layout of the encoder that made it), so one format serves siblings and clients, and the
engine refuses an embedding of another layout (another model or engine) with a 400. Sources
are those of images, under the same rules: a base64 `data:` URL, http(s) through the SSRF-
checked fetcher, or a `file://` path under --allowed-local-media-path.
"""

from __future__ import annotations

from dataclasses import replace

from blake3 import blake3

from trtllm_gateway.engine.disagg.embed_wire import (
    EMBEDS_DTYPES,
    EmbedWireError,
    Frame,
    decode_frames,
)
from trtllm_gateway.engine.protocol import ImageInput
from trtllm_gateway.multimodal.errors import MediaRejectedError

EMBEDS_CODE = "invalid_image_embeds"


def decode_embeds(data: bytes) -> ImageInput:
    """One embedding file -> ImageInput(hash, payload=the checked Frame); MediaRejectedError."""
    try:
        frames = list(decode_frames(data, "embeds"))
    except EmbedWireError as e:
        message = f"image_embeds is not an embedding file: {e}"
        raise MediaRejectedError(message, code=EMBEDS_CODE) from None
    if len(frames) != 1:
        raise MediaRejectedError(
            f"image_embeds must hold one embedding, got {len(frames)}", code=EMBEDS_CODE
        )
    (frame,) = frames
    if len(frame.header.shape) != 2 or 0 in frame.header.shape:
        raise MediaRejectedError(
            f"image_embeds must be [tokens, hidden], got {list(frame.header.shape)}",
            code=EMBEDS_CODE,
        )
    if frame.header.dtype not in EMBEDS_DTYPES:
        raise MediaRejectedError(
            f"image_embeds must be {'/'.join(EMBEDS_DTYPES)}, got {frame.header.dtype}",
            code=EMBEDS_CODE,
        )
    # The width is the engine's to check (the model's hidden size: embed_tensors.check_layout),
    # before any step: a [5, 7] tensor under a 64-wide model's layout ended the engine.
    # Content-addressed like images (the same file is the same "image"); the hash a client
    # wrote in the header is not trusted.
    image_hash = f"embeds-{blake3(data).hexdigest()}"
    header = replace(frame.header, image_hash=image_hash)
    return ImageInput(hash=image_hash, payload=Frame(header, frame.data))
