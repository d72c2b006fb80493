"""data: URLs and confined local files, unit-level and through load_chat_images."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.unit.test_media_server import png_bytes
from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.multimodal import MediaCache, MediaError, MediaRejectedError, load_chat_images
from trtllm_gateway.multimodal.dataurl import decode_data_url
from trtllm_gateway.multimodal.localfile import read_local_file, resolve_local_path


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    # No test here may touch the network: any request through this client fails loudly.
    def no_network(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"unexpected request {request.url}")

    async with httpx.AsyncClient(transport=httpx.MockTransport(no_network)) as c:
        yield c


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat(url: str) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]


# --- data: URLs ------------------------------------------------------------------------------


def test_data_url_round_trip() -> None:
    body = png_bytes()
    assert decode_data_url(data_url(body), max_bytes=10_000) == body
    assert decode_data_url(data_url(body, "application/octet-stream"), max_bytes=10_000) == body
    assert (
        decode_data_url(
            "DATA:image/PNG;BASE64," + base64.b64encode(body).decode(), max_bytes=10_000
        )
        == body
    )


def test_data_url_with_wrapped_base64() -> None:
    body = png_bytes()
    encoded = base64.encodebytes(body).decode()  # newline every 76 chars
    assert decode_data_url(f"data:image/png;base64,{encoded}", max_bytes=10_000) == body


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png;base64,***not-base64***",
        "data:image/png;base64,iVBORw0KGgo",  # bad padding
        "data:image/png,rawbytes",  # not base64
        "data:image/png;base64",  # no comma
        "data:text/html;base64,PGh0bWw+",
        "data:image/png;base64,",
    ],
)
def test_bad_data_urls(url: str) -> None:
    with pytest.raises(MediaRejectedError):
        decode_data_url(url, max_bytes=10_000)


def test_data_url_size_checked_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("decoded an oversized payload")

    monkeypatch.setattr(base64, "b64decode", never)
    with pytest.raises(MediaRejectedError) as info:
        decode_data_url(data_url(b"\0" * 5_000), max_bytes=1_000)
    assert info.value.code == "image_too_large"


def test_data_url_at_the_limit_ok() -> None:
    for size in (998, 999, 1_000):
        assert len(decode_data_url(data_url(b"\1" * size), max_bytes=1_000)) == size
    with pytest.raises(MediaRejectedError):
        decode_data_url(data_url(b"\1" * 1_001), max_bytes=1_000)


async def test_data_url_through_loader(client: httpx.AsyncClient) -> None:
    (image,) = await load_chat_images(
        chat(data_url(png_bytes(6, 2))),
        client=client,
        config=MediaConfig(),
        cache=MediaCache(10**6),
    )
    assert image.payload.size == (6, 2)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,@@@@", "invalid_image_url"),
        (data_url(b"\0" * 3_000), "image_too_large"),
        (data_url(b"GIF89a but not really"), "invalid_image_format"),
    ],
)
async def test_bad_data_url_through_loader(url: str, code: str, client: httpx.AsyncClient) -> None:
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            chat(url), client=client, config=MediaConfig(max_image_bytes=2_000), cache=MediaCache(0)
        )
    assert (info.value.status_code, info.value.code) == (400, code)
    assert info.value.param == "messages[0].content[0].image_url"


# --- local files ----------------------------------------------------------------------------


@pytest.fixture
def media(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "cat.png").write_bytes(png_bytes(3, 3))
    (tmp_path / "secret.png").write_bytes(png_bytes(1, 1))
    return root


@pytest.mark.parametrize(
    "url",
    [
        "sub/cat.png",
        "./sub/../sub/cat.png",
        "{root}/sub/cat.png",
        "file://{root}/sub/cat.png",
        "file://localhost{root}/sub/cat.png",
        "file:{root}/sub/cat.png",
    ],
)
def test_local_paths_inside(url: str, media: Path) -> None:
    path = resolve_local_path(url.format(root=media), media)
    assert path == (media / "sub" / "cat.png").resolve()
    assert read_local_file(path, media, max_bytes=10_000) == png_bytes(3, 3)


@pytest.mark.parametrize(
    "url",
    [
        "../secret.png",
        "sub/../../secret.png",
        "{root}/../secret.png",
        "file://{root}/../secret.png",
        "file://{root}/%2e%2e/secret.png",
        "file://{parent}/secret.png",
        "/etc/passwd",
        "file:///etc/passwd",
        "file://otherhost/etc/passwd",
        "sub/cat.png\x00.txt",
    ],
)
def test_local_paths_outside_refused(url: str, media: Path) -> None:
    with pytest.raises(MediaRejectedError):
        resolve_local_path(url.format(root=media, parent=media.parent), media)


def test_symlink_escape_refused(media: Path) -> None:
    (media / "escape.png").symlink_to(media.parent / "secret.png")
    (media / "escape_dir").symlink_to(media.parent, target_is_directory=True)
    (media / "inside.png").symlink_to(media / "sub" / "cat.png")
    for url in (
        "escape.png",
        "escape_dir/secret.png",
        "escape_dir/media/sub/cat.png/../../../secret.png",
    ):
        with pytest.raises(MediaRejectedError):
            resolve_local_path(url, media)
    # A link that stays inside is fine.
    assert resolve_local_path("inside.png", media) == (media / "sub" / "cat.png").resolve()


def test_local_special_files_refused(media: Path) -> None:
    os.mkfifo(media / "pipe.png")
    for name in ("pipe.png", "sub", "missing.png"):
        with pytest.raises(MediaRejectedError):
            read_local_file(resolve_local_path(name, media), media, max_bytes=10_000)


def test_local_file_too_big(media: Path) -> None:
    (media / "big.png").write_bytes(b"\0" * 2_000)
    with pytest.raises(MediaRejectedError) as info:
        read_local_file(resolve_local_path("big.png", media), media, max_bytes=1_000)
    assert info.value.code == "image_too_large"


async def test_local_files_through_loader(media: Path, client: httpx.AsyncClient) -> None:
    settings = MediaConfig(allowed_local_media_path=media)
    (image,) = await load_chat_images(
        chat(f"file://{media}/sub/cat.png"), client=client, config=settings, cache=MediaCache(0)
    )
    assert image.payload.size == (3, 3)  # type: ignore[attr-defined]
    (media / "escape.png").symlink_to(media.parent / "secret.png")
    for url in ("../secret.png", "escape.png", f"file://{media.parent}/secret.png"):
        with pytest.raises(MediaError) as info:
            await load_chat_images(chat(url), client=client, config=settings, cache=MediaCache(0))
        assert info.value.status_code == 400


async def test_local_files_disabled_by_default(media: Path, client: httpx.AsyncClient) -> None:
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            chat(f"file://{media}/sub/cat.png"),
            client=client,
            config=MediaConfig(),
            cache=MediaCache(0),
        )
    assert info.value.status_code == 400
