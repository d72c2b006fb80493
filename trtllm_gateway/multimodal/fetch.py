"""Fetch image bytes over http(s) through the shared client: pinned, redirect-checked, size-capped.

Redirects are followed here, one checked hop at a time (the client never follows them), and the
whole fetch, DNS included, runs under one deadline rather than per-read timeouts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from trtllm_gateway.multimodal.errors import (
    MediaError,
    MediaRejectedError,
    MediaTimeoutError,
    MediaUpstreamError,
)
from trtllm_gateway.multimodal.ssrf import EgressPolicy, IPAddress, pinned_request

# Images are already compressed; identity keeps the byte cap honest (no gzip bombs). httpx
# decodes whatever Content-Encoding a host sends regardless, a whole chunk at a time on the event
# loop (`gzip, gzip, gzip` of zeros: 272 bytes became gigabytes), so an encoding that was not
# asked for is refused from the headers, before a byte is read: nothing here ever decompresses.
_REQUEST_HEADERS = {
    "Accept": "image/*",
    "Accept-Encoding": "identity",
    # httpcore pools by (scheme, IP, port): an idle TLS connection opened for one name must not
    # serve another name on the same address, so pinned connections are never left idle.
    "Connection": "close",
}
_TRANSIENT_4XX = frozenset({408, 429})
_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class FetchLimits:
    max_bytes: int
    timeout: float
    max_redirects: int


async def fetch_url(
    url: str, *, client: httpx.AsyncClient, policy: EgressPolicy, limits: FetchLimits
) -> bytes:
    """GET an image URL and return its body; raises MediaError (400/502/504) and nothing else."""
    try:
        target = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise MediaRejectedError("malformed image URL", code="invalid_image_url") from None
    try:
        async with asyncio.timeout(limits.timeout):
            return await _fetch_following(target, client, policy, limits)
    except TimeoutError:
        raise MediaTimeoutError(
            f"fetching the image took longer than {limits.timeout:g} s"
        ) from None
    except httpx.TimeoutException:
        raise MediaTimeoutError("fetching the image timed out") from None
    except MediaError:
        raise
    except httpx.InvalidURL:
        raise MediaRejectedError("malformed image URL", code="invalid_image_url") from None
    except httpx.HTTPError as exc:
        raise MediaUpstreamError(f"fetching the image failed: {type(exc).__name__}") from None


async def _fetch_following(
    url: httpx.URL, client: httpx.AsyncClient, policy: EgressPolicy, limits: FetchLimits
) -> bytes:
    for _ in range(limits.max_redirects + 1):
        policy.check_url(url)
        addresses = await policy.checked_addresses(url)
        response = await _send_pinned(client, url, addresses)
        try:
            location = response.headers.get("location")
            if response.is_redirect and location:
                url = _redirect_target(url, location)
                continue
            _check_response(response, limits.max_bytes)
            return await _read_capped(response, limits.max_bytes)
        finally:
            await response.aclose()
    raise MediaRejectedError(
        f"image URL redirected more than {limits.max_redirects} times", code="invalid_image_url"
    )


async def _send_pinned(
    client: httpx.AsyncClient, url: httpx.URL, addresses: list[IPAddress]
) -> httpx.Response:
    """Try the checked addresses in resolver order; only a failed connect moves to the next."""
    last: httpx.ConnectError | None = None
    for address in addresses:
        request = pinned_request(url, address, _REQUEST_HEADERS, client.timeout)
        try:
            response = await client.send(request, stream=True, follow_redirects=False, auth=None)
        except httpx.ConnectError as exc:
            last = exc
            continue
        if not _tls_name_matches(response, request):
            await response.aclose()
            raise MediaUpstreamError("image host connection was not verified for its name")
        return response
    assert last is not None  # checked_addresses never returns an empty list
    raise last


def _tls_name_matches(response: httpx.Response, request: httpx.Request) -> bool:
    """Fail closed if a pooled TLS connection opened for another name was reused (HTTP/2)."""
    expected = request.extensions.get("sni_hostname")
    stream = response.extensions.get("network_stream")
    if expected is None or stream is None:
        return True
    ssl_object = stream.get_extra_info("ssl_object")
    return ssl_object is None or ssl_object.server_hostname == expected


def _redirect_target(current: httpx.URL, location: str) -> httpx.URL:
    try:
        # Relative Locations resolve against the logical URL, never the pinned IP literal.
        return current.join(location)
    except (httpx.InvalidURL, ValueError):
        raise MediaUpstreamError("image host sent an invalid redirect") from None


def _check_response(response: httpx.Response, max_bytes: int) -> None:
    status = response.status_code
    if status >= 500 or status in _TRANSIENT_4XX:
        raise MediaUpstreamError(f"image host answered HTTP {status}")
    if status >= 300 or status < 200:
        raise MediaRejectedError(f"image host answered HTTP {status}", code="invalid_image_url")
    content_type = response.headers.get("content-type", "application/octet-stream")
    mime = content_type.partition(";")[0].strip().lower()
    if not (mime.startswith("image/") or mime in ("application/octet-stream", "")):
        raise MediaRejectedError(
            f"image URL returned content type {mime[:64]!r}, not an image",
            code="invalid_image_format",
        )
    encodings = [e.strip().lower() for e in response.headers.get_list("content-encoding", True)]
    if any(e not in ("", "identity") for e in encodings):
        raise MediaRejectedError(
            f"image host sent Content-Encoding {', '.join(encodings)[:64]!r}; only identity "
            "was asked for",
            code="invalid_image_format",
        )
    length = response.headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise _too_big(max_bytes)


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    body = bytearray()
    # _check_response let only identity through, so httpx's decoder here is a pass-through.
    async for chunk in response.aiter_bytes(_CHUNK):
        body += chunk
        if len(body) > max_bytes:
            raise _too_big(max_bytes)
    return bytes(body)


def _too_big(max_bytes: int) -> MediaRejectedError:
    return MediaRejectedError(
        f"image is larger than the {max_bytes} byte limit", code="image_too_large"
    )
