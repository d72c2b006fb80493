"""Image bytes -> (BLAKE3 hash, RGB PIL image), with a per-call pixel limit checked before decoding.

Pillow's own module-level MAX_IMAGE_PIXELS stays untouched (it is process-global); ours is checked
on the header size, before any pixel data is decoded: the pixels the image will have once the
model's processor has resized it (EngineInfo.image_resize_edge), and its aspect ratio. Only a
few plain raster formats are opened: no EPS (Ghostscript), no TIFF, no plugins that shell out.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Final

from blake3 import blake3
from PIL import Image

from trtllm_gateway.engine.image_resize import resized_pixels
from trtllm_gateway.multimodal.errors import MediaRejectedError

ALLOWED_FORMATS: Final = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # JPEG covers MPO
_WHITE = (255, 255, 255)


def hash_image_bytes(data: bytes) -> str:
    """The image's identity for caches and prefix caching: BLAKE3 of its encoded bytes, hex."""
    return str(blake3(data).hexdigest())


def rgb_nbytes(image: Image.Image) -> int:
    """Bytes the decoded RGB pixels hold, for the cache's size accounting."""
    width, height = image.size
    return width * height * 3


def image_pixels(
    data: bytes,
    *,
    max_pixels: int,
    max_aspect_ratio: float = float("inf"),
    resize_edge: int = 0,
) -> int:
    """The image's pixels as the model will see them, from the header alone, nothing decoded
    (blocking but quick: a thread); checked_pixels says which.

    The decoded-pixel budget is reserved with it before decode_image runs. Raises as
    decode_image does for a header that is not a supported image, too thin or too large.
    """
    with _opened(data) as image:
        return checked_pixels(image.size, max_pixels, max_aspect_ratio, resize_edge)


def decode_image(
    data: bytes,
    *,
    max_pixels: int,
    max_aspect_ratio: float = float("inf"),
    resize_edge: int = 0,
) -> Image.Image:
    """Decode to a fully loaded RGB image (blocking: run it in a thread).

    Raises MediaRejectedError for anything that is not a supported image, is truncated, is
    thinner than max_aspect_ratio or has more than max_pixels pixels once resized (checked from
    the header, before decoding).
    """
    with _opened(data) as image:
        checked_pixels(image.size, max_pixels, max_aspect_ratio, resize_edge)
        image.load()
        return _to_rgb(image)


@contextlib.contextmanager
def _opened(data: bytes) -> Iterator[Image.Image]:
    """The image Pillow opens from data; whatever goes wrong inside is a MediaRejectedError."""
    try:
        with Image.open(io.BytesIO(data), formats=_available_formats()) as image:
            yield image
    except MediaRejectedError:
        raise
    # Pillow's process-wide guard (MAX_IMAGE_PIXELS) can fire before our per-call check; its
    # warning is an exception where warnings are errors. Either way: too many pixels.
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_many_pixels() from None
    except Exception:  # Pillow raises many types for corrupt input; all mean "not an image"
        raise _not_an_image() from None


def checked_pixels(
    size: tuple[int, int],
    max_pixels: int,
    max_aspect_ratio: float = float("inf"),
    resize_edge: int = 0,
) -> int:
    """The pixels an image of `size` counts: the larger of its own and those it will have once
    the model's processor resized its shortest edge to resize_edge (0: no resize). Raises
    MediaRejectedError when it is too thin (image_aspect_ratio) or counts more than max_pixels
    (image_too_large)."""
    width, height = size
    if width <= 0 or height <= 0:
        raise _not_an_image()
    ratio = max(width, height) / min(width, height)
    if ratio > max_aspect_ratio:
        raise MediaRejectedError(
            f"image is {width}x{height}, an aspect ratio of {ratio:.0f}:1, more than the "
            f"{max_aspect_ratio:g}:1 allowed (--max-image-aspect-ratio)",
            code="image_aspect_ratio",
        )
    pixels = max(width * height, resized_pixels(width, height, resize_edge))
    if pixels > max_pixels:
        resized = "" if pixels == width * height else f" once resized for the model ({pixels})"
        raise MediaRejectedError(
            f"image has {width}x{height} pixels{resized}, more than the {max_pixels} allowed",
            code="image_too_large",
        )
    return pixels


def _too_many_pixels() -> MediaRejectedError:
    return MediaRejectedError("image has more pixels than allowed", code="image_too_large")


def _available_formats() -> list[str]:
    Image.init()  # registers every plugin once; later calls return at once
    return [fmt for fmt in ALLOWED_FORMATS if fmt in Image.OPEN]


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB copy; transparency is composited on white, as vLLM does, instead of turning black."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, _WHITE)
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    if image.mode == "RGB":
        return image.copy()
    return image.convert("RGB")


def _not_an_image() -> MediaRejectedError:
    return MediaRejectedError(
        "image could not be decoded (supported: PNG, JPEG, WEBP, GIF, BMP)",
        code="invalid_image_format",
    )
