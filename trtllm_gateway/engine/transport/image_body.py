"""Images between the client and the core: embed_wire frames, one body per request.

The client sends a request's decoded images (or precomputed embeddings) as the frame after its
Add; the core turns them back into ImageInputs, checked against the hashes the Add announced.
"""

from __future__ import annotations

from trtllm_gateway.engine.disagg.embed_wire import Frame, decode_frames, encode_frame
from trtllm_gateway.engine.protocol import ImageInput, InvalidRequestError


def images_body(images: tuple[ImageInput, ...]) -> bytes:
    """The gateway side: decoded RGB images as one body of "pixels" frames (a precomputed
    embedding, an image_embeds part, goes as its own "embeds" frame)."""
    out = []
    for img in images:
        if isinstance(img.payload, Frame):
            h = img.payload.header
            data = img.payload.data
            out.append(encode_frame("embeds", img.hash, h.dtype, h.shape, data, h.layout))
            continue
        pil = img.payload
        w, h = pil.size  # type: ignore[attr-defined]
        raw = pil.tobytes()  # type: ignore[attr-defined]
        out.append(encode_frame("pixels", img.hash, "uint8", (h, w, 3), raw))
    return b"".join(out)


def images_from_body(body: bytes, hashes: tuple[str, ...]) -> tuple[ImageInput, ...]:
    """The core side: the body back into images, in the order (and with the hashes) announced."""
    from PIL import Image

    images = []
    try:
        for frame in decode_frames(body, ("pixels", "embeds")):
            if frame.header.kind == "embeds":
                images.append(ImageInput(hash=frame.header.image_hash, payload=frame))
                continue
            h, w, _ = frame.header.shape
            pil = Image.frombytes("RGB", (w, h), bytes(frame.data))
            images.append(ImageInput(hash=frame.header.image_hash, payload=pil))
    except ValueError as e:
        raise InvalidRequestError(f"bad image frames: {e}") from None
    if tuple(img.hash for img in images) != hashes:
        raise InvalidRequestError("image frames do not match the request's images")
    return tuple(images)
