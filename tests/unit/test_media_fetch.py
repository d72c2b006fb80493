"""http(s) fetch against a real loopback server: limits, types, statuses, redirects, timeouts."""

from __future__ import annotations

import gzip
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from blake3 import blake3
from PIL import Image

from tests.unit.test_media_server import ImageServer, Route, png_bytes
from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.multimodal import MediaCache, MediaError, MediaMetrics, load_chat_images

PARAM = "messages[0].content[0].image_url"


@pytest.fixture
def server() -> Iterator[ImageServer]:
    with ImageServer() as s:
        yield s


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as c:
        yield c


def settings(**overrides: object) -> MediaConfig:
    base: dict[str, object] = {
        "allow_private_media_urls": True,
        "media_fetch_timeout": 2.0,
        "max_image_bytes": 100_000,
    }
    return MediaConfig(**{**base, **overrides})  # type: ignore[arg-type]


def chat(url: str) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]


async def load(url: str, client: httpx.AsyncClient, **overrides: object) -> list[object]:
    return list(
        await load_chat_images(
            chat(url), client=client, config=settings(**overrides), cache=MediaCache(10**7)
        )
    )


async def refused(url: str, client: httpx.AsyncClient, **overrides: object) -> MediaError:
    with pytest.raises(MediaError) as info:
        await load(url, client, **overrides)
    assert info.value.param == PARAM
    return info.value


async def test_png_loads_as_rgb_with_blake3_hash(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    body = png_bytes(5, 7, mode="L", color=128)
    server.routes["/a.png"] = Route(body=body)
    metrics = MediaMetrics()
    (image,) = await load_chat_images(
        chat(server.url("/a.png")),
        client=client,
        config=settings(),
        cache=MediaCache(10**6),
        metrics=metrics,
    )
    assert image.hash == blake3(body).hexdigest()
    assert isinstance(image.payload, Image.Image)
    assert image.payload.mode == "RGB"
    assert image.payload.size == (5, 7)
    assert metrics.fetches[("http", "ok")] == 1
    assert metrics.bytes_loaded["http"] == len(body)
    (seen,) = server.requests
    assert seen.headers["accept-encoding"] == "identity"


async def test_octet_stream_and_missing_type_are_sniffed(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/bin"] = Route(body=png_bytes(), content_type="application/octet-stream")
    server.routes["/none"] = Route(body=png_bytes(), content_type=None)
    assert len(await load(server.url("/bin"), client)) == 1
    assert len(await load(server.url("/none"), client)) == 1


async def test_content_length_over_limit(server: ImageServer, client: httpx.AsyncClient) -> None:
    server.routes["/big.png"] = Route(body=b"\x89PNG" + b"\0" * 200_000)
    err = await refused(server.url("/big.png"), client)
    assert (err.status_code, err.code) == (400, "image_too_large")


@pytest.mark.parametrize("encoding", ["gzip, gzip, gzip", "deflate", "br", "GZIP"])
async def test_an_encoding_not_asked_for_is_refused_undecoded(
    server: ImageServer, client: httpx.AsyncClient, encoding: str
) -> None:
    """Issue 24: a 3-layer gzip bomb (272 bytes per URL took the gateway to 3.5 GB) is refused
    from its headers, and nothing is decompressed meanwhile."""
    bomb = b"\0" * (64 << 20)
    for _ in range(3):
        bomb = gzip.compress(bomb, compresslevel=9)
    assert len(bomb) < 4096
    server.routes["/bomb.png"] = Route(body=bomb, headers={"Content-Encoding": encoding})
    tracemalloc.start()
    try:
        err = await refused(server.url("/bomb.png"), client)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (err.status_code, err.code) == (400, "invalid_image_format")
    assert "Content-Encoding" in err.message
    assert peak < 8 << 20, peak  # decoding one layer of it would take 64 MB


async def test_lying_content_length_still_capped(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    # Declares little, sends more: the streamed cap (or h11's framing check) must hold.
    server.routes["/liar.png"] = Route(body=b"\0" * 200_000, headers={"Content-Length": "10"})
    err = await refused(server.url("/liar.png"), client)
    assert err.status_code == 400


async def test_chunked_without_length_over_limit(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/stream.png"] = Route(body=b"\0" * 16_384, chunked=True, chunk_count=64)
    err = await refused(server.url("/stream.png"), client)
    assert (err.status_code, err.code) == (400, "image_too_large")


async def test_chunked_within_limit_ok(server: ImageServer, client: httpx.AsyncClient) -> None:
    server.routes["/ok.png"] = Route(body=png_bytes(), chunked=True)
    assert len(await load(server.url("/ok.png"), client)) == 1


async def test_too_many_pixels(server: ImageServer, client: httpx.AsyncClient) -> None:
    server.routes["/wide.png"] = Route(body=png_bytes(100, 100))
    err = await refused(server.url("/wide.png"), client, max_image_pixels=9_999)
    assert (err.status_code, err.code) == (400, "image_too_large")


async def test_not_an_image(server: ImageServer, client: httpx.AsyncClient) -> None:
    server.routes["/fake.png"] = Route(body=b"<html>definitely not a png</html>")
    err = await refused(server.url("/fake.png"), client)
    assert (err.status_code, err.code) == (400, "invalid_image_format")


@pytest.mark.parametrize(
    "content_type", ["text/html", "application/json", "text/plain; charset=utf-8"]
)
async def test_wrong_content_type(
    content_type: str, server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/page"] = Route(body=png_bytes(), content_type=content_type)
    err = await refused(server.url("/page"), client)
    assert (err.status_code, err.code) == (400, "invalid_image_format")


async def test_slow_server_times_out_504(server: ImageServer, client: httpx.AsyncClient) -> None:
    server.routes["/slow.png"] = Route(body=png_bytes(), delay=10.0)
    started = time.monotonic()
    err = await refused(server.url("/slow.png"), client, media_fetch_timeout=0.3)
    assert time.monotonic() - started < 2.0
    assert (err.status_code, err.type) == (504, "server_error")


async def test_slow_trickle_is_bounded_by_the_whole_fetch_deadline(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    # Each chunk arrives fast enough for a per-read timeout, the whole body does not.
    server.routes["/trickle.png"] = Route(
        body=b"\0" * 10, chunked=True, chunk_count=100, chunk_delay=0.05
    )
    started = time.monotonic()
    err = await refused(
        server.url("/trickle.png"), client, media_fetch_timeout=0.3, max_image_bytes=10**9
    )
    assert time.monotonic() - started < 2.0
    assert err.status_code == 504


@pytest.mark.parametrize(
    ("status", "expected"), [(500, 502), (503, 502), (429, 502), (404, 400), (403, 400)]
)
async def test_upstream_status_mapping(
    status: int, expected: int, server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/x.png"] = Route(status=status, content_type="text/plain", body=b"nope")
    err = await refused(server.url("/x.png"), client)
    assert err.status_code == expected


async def test_connection_refused_is_502(client: httpx.AsyncClient) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    err = await refused(f"http://127.0.0.1:{port}/a.png", client)
    assert (err.status_code, err.code) == (502, "image_fetch_failed")


async def test_redirects_followed_up_to_the_limit(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/final.png"] = Route(body=png_bytes())
    for hop in range(3):
        target = "/final.png" if hop == 2 else f"/hop{hop + 1}"
        server.routes[f"/hop{hop}"] = Route(status=307, headers={"Location": target})
    assert len(await load(server.url("/hop0"), client, max_redirects=3)) == 1
    server.requests.clear()
    err = await refused(server.url("/hop0"), client, max_redirects=2)
    assert err.status_code == 400
    assert [s.path for s in server.requests] == ["/hop0", "/hop1", "/hop2"]


async def test_redirect_loop(server: ImageServer, client: httpx.AsyncClient) -> None:
    server.routes["/loop"] = Route(status=302, headers={"Location": "/loop"})
    err = await refused(server.url("/loop"), client, max_redirects=5)
    assert err.status_code == 400
    assert len(server.requests) == 6
