"""load_chat_images and count_images: message walking, limits, params, cache, metrics, cancel."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.unit.test_media_server import ImageServer, Route, png_bytes
from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.multimodal import (
    IMAGE_NAMESPACE,
    MediaCache,
    MediaError,
    MediaMetrics,
    count_images,
    load_chat_images,
)


@pytest.fixture
def server() -> Iterator[ImageServer]:
    with ImageServer() as s:
        yield s


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as c:
        yield c


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_part(url: str, *, string_form: bool = False) -> dict[str, object]:
    if string_form:
        return {"type": "image_url", "image_url": url}
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


SETTINGS = MediaConfig(allow_private_media_urls=True, media_fetch_timeout=5.0)


def test_count_images() -> None:
    messages = [
        {"role": "system", "content": "plain text"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                image_part("a"),
                image_part("b", string_form=True),
            ],
        },
        {"role": "assistant", "content": None},
        {"role": "user", "content": [image_part("c"), {"type": "input_audio", "input_audio": {}}]},
    ]
    assert count_images(messages) == 3
    assert count_images([]) == 0
    assert count_images([{"role": "user", "content": "text only"}]) == 0


async def test_no_images_touches_nothing() -> None:
    def no_network(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    async with httpx.AsyncClient(transport=httpx.MockTransport(no_network)) as client:
        result = await load_chat_images(
            [{"role": "user", "content": "hi"}],
            client=client,
            config=SETTINGS,
            cache=MediaCache(0),
        )
    assert result == []


async def test_images_in_request_order_with_both_url_forms(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/wide.png"] = Route(body=png_bytes(9, 1))
    messages = [
        {"role": "user", "content": [image_part(data_url(png_bytes(1, 1)))]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and"},
                image_part(server.url("/wide.png"), string_form=True),
            ],
        },
        {"role": "user", "content": [image_part(data_url(png_bytes(2, 2)))]},
    ]
    images = await load_chat_images(
        messages, client=client, config=SETTINGS, cache=MediaCache(10**6)
    )
    assert [img.payload.size for img in images] == [(1, 1), (9, 1), (2, 2)]  # type: ignore[attr-defined]


async def test_too_many_images_refused_before_fetching(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/a.png"] = Route(body=png_bytes())
    parts = [image_part(server.url("/a.png")) for _ in range(3)]
    settings = MediaConfig(allow_private_media_urls=True, max_images_per_request=2)
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            [{"role": "user", "content": parts}],
            client=client,
            config=settings,
            cache=MediaCache(0),
        )
    assert (info.value.status_code, info.value.code) == (400, "too_many_images")
    assert info.value.param == "messages[0].content[2].image_url"
    assert server.requests == []


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url"},
        {"type": "image_url", "image_url": {"detail": "auto"}},
        {"type": "image_url", "image_url": {"url": ""}},
        {"type": "image_url", "image_url": {"url": 42}},
        {"type": "image_url", "image_url": None},
    ],
)
async def test_malformed_parts_are_400_with_param(
    part: dict[str, object], client: httpx.AsyncClient
) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]
    with pytest.raises(MediaError) as info:
        await load_chat_images(messages, client=client, config=SETTINGS, cache=MediaCache(0))
    assert info.value.status_code == 400
    assert info.value.param == "messages[0].content[1].image_url"


async def test_same_image_twice_hits_the_cache(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    body = png_bytes(4, 4)
    server.routes["/a.png"] = Route(body=body)
    cache, metrics = MediaCache(10**6), MediaMetrics()
    messages = [{"role": "user", "content": [image_part(server.url("/a.png"))]}]
    (first,) = await load_chat_images(
        messages, client=client, config=SETTINGS, cache=cache, metrics=metrics
    )
    (second,) = await load_chat_images(
        messages, client=client, config=SETTINGS, cache=cache, metrics=metrics
    )
    # Same bytes from another source share the entry too: the key is the content hash.
    (third,) = await load_chat_images(
        [{"role": "user", "content": [image_part(data_url(body))]}],
        client=client,
        config=SETTINGS,
        cache=cache,
        metrics=metrics,
    )
    assert first.hash == second.hash == third.hash
    assert second.payload is first.payload is third.payload
    assert (metrics.cache_hits, metrics.cache_misses, metrics.images_decoded) == (2, 1, 1)
    assert (IMAGE_NAMESPACE, first.hash) in cache
    assert cache.bytes_used == 4 * 4 * 3
    assert metrics.fetches[("http", "ok")] == 2
    assert metrics.fetches[("data", "ok")] == 1
    assert metrics.bytes_loaded["http"] == 2 * len(body)


async def test_first_failing_image_names_the_param(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/ok.png"] = Route(body=png_bytes())
    server.routes["/bad"] = Route(status=404, content_type="text/plain")
    parts = [
        image_part(server.url("/ok.png")),
        image_part(server.url("/bad")),
        image_part("ftp://x/y.png"),
    ]
    metrics = MediaMetrics()
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            [{"role": "user", "content": parts}],
            client=client,
            config=SETTINGS,
            cache=MediaCache(0),
            metrics=metrics,
        )
    assert info.value.param in (
        "messages[0].content[1].image_url",
        "messages[0].content[2].image_url",
    )
    assert metrics.fetches[("other", "rejected")] == 1


async def test_one_failure_cancels_the_slow_siblings(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/slow.png"] = Route(body=png_bytes(), delay=10.0)
    parts = [image_part(server.url("/slow.png")), image_part("data:image/png;base64,!!!")]
    metrics = MediaMetrics()
    started = time.monotonic()
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            [{"role": "user", "content": parts}],
            client=client,
            config=SETTINGS,
            cache=MediaCache(0),
            metrics=metrics,
        )
    assert time.monotonic() - started < 2.0
    assert info.value.param == "messages[0].content[1].image_url"
    assert metrics.fetches[("http", "cancelled")] == 1


async def test_cancelling_the_request_cancels_the_fetch(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/slow.png"] = Route(body=png_bytes(), delay=10.0)
    metrics = MediaMetrics()
    task = asyncio.create_task(
        load_chat_images(
            [{"role": "user", "content": [image_part(server.url("/slow.png"))]}],
            client=client,
            config=SETTINGS,
            cache=MediaCache(0),
            metrics=metrics,
        )
    )
    assert await asyncio.to_thread(server.got_request.wait, 5), "fetch never reached the server"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=1.0)
    assert metrics.fetches[("http", "cancelled")] == 1


async def test_media_error_attributes_for_the_gateway(client: httpx.AsyncClient) -> None:
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            [{"role": "user", "content": [image_part("gopher://x/")]}],
            client=client,
            config=SETTINGS,
            cache=MediaCache(0),
        )
    err = info.value
    assert (err.status_code, err.type, err.code) == (
        400,
        "invalid_request_error",
        "invalid_image_url",
    )
    assert err.param == "messages[0].content[0].image_url"
    assert err.message.startswith("unsupported image URL")


def test_messages_must_be_mappings() -> None:
    class Model:
        content = ({"type": "image_url", "image_url": {"url": "x"}},)

    with pytest.raises(TypeError, match="mapping"):
        count_images([Model()])  # type: ignore[list-item]
