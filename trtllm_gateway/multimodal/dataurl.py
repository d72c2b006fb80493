"""Decode RFC 2397 `data:` image URLs (base64 only), refusing oversized payloads before decoding."""

from __future__ import annotations

import base64
import binascii

from trtllm_gateway.multimodal.errors import MediaRejectedError

_ACCEPTED_MIME_PREFIX = "image/"
_ACCEPTED_MIME = frozenset({"", "application/octet-stream"})


def is_data_url(url: str) -> bool:
    return url[:5].lower() == "data:"


def decode_data_url(url: str, *, max_bytes: int) -> bytes:
    """Return the decoded bytes of `data:image/...;base64,<payload>`; MediaRejectedError if not."""
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise MediaRejectedError("malformed data URL: no ',' separator", code="invalid_image_url")
    params = [p.strip().lower() for p in header.split(";")]
    mime, options = params[0], params[1:]
    if "base64" not in options:
        raise MediaRejectedError("data URLs must be base64-encoded", code="invalid_image_url")
    if not (mime.startswith(_ACCEPTED_MIME_PREFIX) or mime in _ACCEPTED_MIME):
        raise MediaRejectedError(
            f"data URL media type {mime[:64]!r} is not an image", code="invalid_image_format"
        )
    # Checked on the encoded length (decoded is at most 3/4 of it) so nothing oversized is decoded.
    if len(payload) * 3 // 4 - 2 > max_bytes:
        raise _too_big(max_bytes)
    data = _b64decode(payload)
    if len(data) > max_bytes:
        raise _too_big(max_bytes)
    if not data:
        raise MediaRejectedError("data URL is empty", code="invalid_image_url")
    return data


def _b64decode(payload: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        pass
    # Some clients wrap base64 lines; whitespace is the one leniency allowed.
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise MediaRejectedError("data URL is not valid base64", code="invalid_image_url") from None


def _too_big(max_bytes: int) -> MediaRejectedError:
    return MediaRejectedError(
        f"image is larger than the {max_bytes} byte limit", code="image_too_large"
    )
