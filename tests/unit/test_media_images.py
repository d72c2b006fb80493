"""Decoding: formats, RGB conversion, transparency, pixel limit before decode, corrupt input."""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from pathlib import Path

import pytest
from blake3 import blake3
from PIL import Image

from tests.unit.test_media_server import png_bytes
from trtllm_gateway.engine.image_resize import resize_edge, resized_pixels
from trtllm_gateway.multimodal.errors import MediaRejectedError
from trtllm_gateway.multimodal.images import (
    checked_pixels,
    decode_image,
    hash_image_bytes,
    image_pixels,
    rgb_nbytes,
)


def png_header(width: int, height: int) -> bytes:
    """A PNG claiming width x height (1-bit grey) with one tiny IDAT behind it: a pixel bomb."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


def encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_supported_formats_decode_to_rgb(fmt: str) -> None:
    image = decode_image(encode(Image.new("RGB", (8, 6), "blue"), fmt), max_pixels=1_000)
    assert (image.mode, image.size) == ("RGB", (8, 6))
    assert rgb_nbytes(image) == 8 * 6 * 3


@pytest.mark.parametrize("mode", ["L", "LA", "P", "RGBA", "I;16", "1", "CMYK"])
def test_modes_convert_to_rgb(mode: str) -> None:
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    image = decode_image(encode(Image.new(mode, (3, 3)), fmt), max_pixels=100)
    assert image.mode == "RGB"


def test_transparency_composited_on_white() -> None:
    rgba = Image.new("RGBA", (2, 1), (0, 0, 0, 0))
    rgba.putpixel((1, 0), (255, 0, 0, 255))
    image = decode_image(encode(rgba, "PNG"), max_pixels=100)
    assert image.getpixel((0, 0)) == (255, 255, 255)
    assert image.getpixel((1, 0)) == (255, 0, 0)


def test_palette_with_transparency_no_warning() -> None:
    palette = Image.new("P", (2, 2), 0)
    data = encode(palette, "PNG", transparency=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        image = decode_image(data, max_pixels=100)
    assert image.getpixel((0, 0)) == (255, 255, 255)


def test_pixel_limit_checked_from_header_before_decoding() -> None:
    # A header claiming 8000x8000 with almost no data behind it: refused on size, never decoded.
    header = png_header(8_000, 8_000)
    with pytest.raises(MediaRejectedError) as info:
        decode_image(header, max_pixels=50_000_000)
    assert info.value.code == "image_too_large"
    assert "8000x8000" in info.value.message


def test_pillow_global_bomb_guard_maps_to_too_large() -> None:
    # Past Pillow's own process-wide limit its guard fires first; still a 400 image_too_large.
    header = png_header(30_000, 30_000)
    with pytest.raises(MediaRejectedError) as info:
        decode_image(header, max_pixels=10**10)
    assert info.value.code == "image_too_large"


def test_pixel_limit_is_per_call_not_global() -> None:
    before = Image.MAX_IMAGE_PIXELS
    data = png_bytes(100, 100)
    with pytest.raises(MediaRejectedError):
        decode_image(data, max_pixels=9_999)
    assert decode_image(data, max_pixels=10_000).size == (100, 100)
    assert before == Image.MAX_IMAGE_PIXELS


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello world",
        b"\x89PNG\r\n\x1a\n" + b"\0" * 50,
        png_bytes(50, 50)[:-40],  # truncated
        encode(Image.new("RGB", (4, 4)), "TIFF"),  # a real image, but not an allowed format
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n",
    ],
)
def test_not_an_image(data: bytes) -> None:
    with pytest.raises(MediaRejectedError) as info:
        decode_image(data, max_pixels=10**6)
    assert info.value.code == "invalid_image_format"


def test_hash_is_blake3_hex_of_bytes() -> None:
    data = png_bytes()
    assert hash_image_bytes(data) == blake3(data).hexdigest()
    assert hash_image_bytes(data) != hash_image_bytes(png_bytes(color="blue"))


def test_a_thin_image_is_refused_by_its_aspect_ratio_before_decoding() -> None:
    """Issue 40 item 5: a 117-byte 1 x 300,000 PNG, enlarged by the model's processor until its
    short edge fits (every LLaVA: shortest edge 336), took an engine core from 412 MB to 3.3 GB.
    The header says enough: refused at 200:1 (the default), nothing decoded."""
    header = png_header(300_000, 1)
    with pytest.raises(MediaRejectedError) as info:
        decode_image(header, max_pixels=40_000_000, max_aspect_ratio=200)
    assert info.value.code == "image_aspect_ratio"
    assert "300000x1" in info.value.message and "--max-image-aspect-ratio" in info.value.message
    with pytest.raises(MediaRejectedError, match="aspect ratio"):
        image_pixels(png_header(1, 201), max_pixels=10**6, max_aspect_ratio=200)
    assert image_pixels(png_header(1, 200), max_pixels=10**6, max_aspect_ratio=200) == 200


def test_pixels_count_as_the_model_will_see_them() -> None:
    """A 4 x 800 image (200:1, allowed) has 3,200 pixels, but a processor resizing its shortest
    edge to 32 makes it 32 x 6,400: 204,800 pixels, counted in the limit and the budget."""
    data = png_header(4, 800)
    assert image_pixels(data, max_pixels=10**6) == 3_200
    assert image_pixels(data, max_pixels=10**6, resize_edge=32) == 204_800
    with pytest.raises(MediaRejectedError) as info:
        image_pixels(data, max_pixels=100_000, resize_edge=32)
    assert info.value.code == "image_too_large" and "once resized" in info.value.message
    # A large image shrinks: its own pixels count.
    assert checked_pixels((1000, 2000), 10**7, 200, 32) == 2_000_000
    # transformers' get_resize_output_image_size: the long edge is int(edge * long / short).
    assert resized_pixels(3, 10, 32) == 32 * int(32 * 10 / 3)


def test_the_resize_edge_is_the_checkpoints(tmp_path: Path) -> None:
    assert resize_edge(tmp_path) == 0  # no preprocessor_config.json
    (tmp_path / "preprocessor_config.json").write_text('{"size": {"shortest_edge": 336}}')
    assert resize_edge(tmp_path) == 336
    (tmp_path / "preprocessor_config.json").write_text('{"size": {"height": 384, "width": 384}}')
    assert resize_edge(tmp_path) == 384
    (tmp_path / "preprocessor_config.json").write_text("not json")
    assert resize_edge(tmp_path) == 0
