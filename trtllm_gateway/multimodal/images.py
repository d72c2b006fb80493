"""Image bytes -> (BLAKE3 hash, RGB PIL image), with a per-call pixel limit checked before decoding.

Pillow's own module-level MAX_IMAGE_PIXELS stays untouched (it is process-global); ours is checked
on the header size, before any pixel data is decoded. Only a few plain raster formats are opened:
no EPS (Ghostscript), no TIFF, no plugins that shell out.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Final

from blake3 import blake3
from PIL import Image

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


def image_pixels(data: bytes, *, max_pixels: int) -> int:
    """width x height from the header alone, nothing decoded (blocking but quick: a thread).

    The decoded-pixel budget is reserved with it before decode_image runs. Raises as
    decode_image does for a header that is not a supported image or has too many pixels.
    """
    with _opened(data) as image:
        return _checked_pixels(image, max_pixels)


def decode_image(data: bytes, *, max_pixels: int) -> Image.Image:
    """Decode to a fully loaded RGB image (blocking: run it in a thread).

    Raises MediaRejectedError for anything that is not a supported image, is truncated, or has
    more than max_pixels pixels (checked from the header, before decoding).
    """
    with _opened(data) as image:
        _checked_pixels(image, max_pixels)
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


def _checked_pixels(image: Image.Image, max_pixels: int) -> int:
    width, height = image.size
    if width <= 0 or height <= 0:
        raise _not_an_image()
    if width * height > max_pixels:
        raise MediaRejectedError(
            f"image has {width}x{height} pixels, more than the {max_pixels} allowed",
            code="image_too_large",
        )
    return width * height


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
