"""Images end to end: the official openai SDK against real servers on a tiny random LLaVA.

One aggregated instance with --encode-url pointing at an encode instance (EPD, two processes);
images arrive as a data URL, an http URL on a loopback server (--allow-private-media-urls) and
a local file (--allowed-local-media-path). Random weights answer gibberish, so the checks are
equalities: across sources, remote vs local encoding, and different images differ. Then E, P
and D apart: a decode instance with both --prefill-url and --encode-url counts both in /metrics.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from PIL import Image

from tests.e2e.ops_client import INTERNAL_AUTH, INTERNAL_KEY
from tests.e2e.server import Server
from tests.engine.tiny_llava import build_tiny_llava
from tests.unit.test_media_server import ImageServer, Route

COMMON = ["--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "256", "--block-size", "4"]
COMMON += ["--internal-api-key", INTERNAL_KEY]  # encode and prefill siblings take only it


def _png(path: Path, image: Image.Image) -> bytes:
    image.save(path, format="PNG")
    return path.read_bytes()


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("llava-e2e")
    model = build_tiny_llava(root / "model", "llava")
    media = root / "media"
    media.mkdir()
    red = _png(media / "red.png", Image.new("RGB", (40, 40), (200, 30, 30)))
    grad = _png(media / "grad.png", Image.radial_gradient("L").convert("RGB").resize((48, 32)))
    return {"model": model, "media": media, "red": red, "grad": grad}


@pytest.fixture(scope="module")
def encoder(assets: dict[str, Any], log_dir: Path) -> Iterator[Server]:
    srv = Server(args=["--mode", "encode", "--model", str(assets["model"]), *COMMON])
    yield srv.start(log_dir)
    srv.stop()


@pytest.fixture(scope="module")
def vlm(assets: dict[str, Any], encoder: Server, log_dir: Path) -> Iterator[Server]:
    args = [
        "--model", str(assets["model"]), *COMMON,
        "--encode-url", encoder.url,
        "--allow-private-media-urls",
        "--allowed-local-media-path", str(assets["media"]),
        "--vision-embed-cache-bytes", "0",  # every request encodes: remote, or local fallback
    ]  # fmt: skip
    srv = Server(args=args).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def epd_decode(assets: dict[str, Any], encoder: Server, log_dir: Path) -> Iterator[Server]:
    """A decode instance that sends images to the encoder and text prompts to a prefill one."""
    model = ["--model", str(assets["model"]), *COMMON]
    prefill = Server(args=["--mode", "prefill", *model]).start(log_dir)
    args = [
        "--mode", "decode", *model,
        "--prefill-url", prefill.url,
        "--encode-url", encoder.url,
        "--max-local-prefill-tokens", "4",
    ]  # fmt: skip
    try:
        srv = Server(args=args).start(log_dir)
        yield srv
        assert srv.stop() == 0, srv.log()
    finally:
        prefill.stop()


@pytest.fixture(scope="module")
def images_http(assets: dict[str, Any]) -> Iterator[ImageServer]:
    with ImageServer() as http:
        http.routes["/red.png"] = Route(body=assets["red"])
        yield http


def ask(srv: Server, url: str, **kw: Any) -> Any:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "describe the picture"},
    ]
    return client.chat.completions.create(
        model=kw.pop("model", "model"),
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        temperature=0,
        max_tokens=8,
        extra_body={"ignore_eos": True},
        **kw,
    )


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def test_sources_agree_and_images_differ(
    vlm: Server, assets: dict[str, Any], images_http: ImageServer
) -> None:
    by_data = ask(vlm, data_url(assets["red"]))
    by_http = ask(vlm, images_http.url("/red.png"))
    by_file = ask(vlm, f"file://{assets['media'] / 'red.png'}")
    texts = [r.choices[0].message.content for r in (by_data, by_http, by_file)]
    assert texts[0] and texts == [texts[0]] * 3
    assert ask(vlm, data_url(assets["grad"])).choices[0].message.content != texts[0]
    # 16 image positions replace the one <image> token the template wrote.
    assert by_data.usage.prompt_tokens == 11 - 1 + 16
    assert images_http.requests, "the http image was fetched from the loopback server"


def test_epd_decode_counts_remote_encode_and_remote_prefill(
    epd_decode: Server, assets: dict[str, Any]
) -> None:
    def count(name: str, outcome: str) -> float:
        return epd_decode.metric(f"trtllm_gateway:{name}_total", f'outcome="{outcome}"')

    # An image request: encoded on the encode instance, prefilled here (images never go remote).
    assert ask(epd_decode, data_url(assets["red"])).choices[0].message.content
    assert count("remote_encode", "remote") == 1
    assert count("remote_prefill", "local_short") == 1
    # A text request: prefilled on the prefill instance, its KV pulled here.
    text: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "describe a red square in a few words"}
    ]
    client = openai.OpenAI(base_url=f"{epd_decode.url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="model", messages=text, max_tokens=4, temperature=0
    )
    assert reply.choices[0].message.content is not None
    assert count("remote_prefill", "remote") == 1
    assert epd_decode.metric("trtllm_gateway:kv_transfer_bytes_total") > 0
    assert count("remote_encode", "remote") == 1  # the text request encoded nothing


# Before test_remote_encoding_equals_local_fallback, which stops the module's encoder.
def test_an_embedding_file_from_the_encoder_answers_as_the_image(
    vlm: Server, encoder: Server, assets: dict[str, Any]
) -> None:
    """Issue 21 item 8: what an encode instance answers over the sibling protocol is the file a
    client may send as an image_embeds part; the answer equals the image's."""
    from trtllm_gateway.engine.disagg.embed_tensors import pixel_frames
    from trtllm_gateway.engine.disagg.embed_wire import CONTENT_TYPE
    from trtllm_gateway.engine.disagg.sibling_wire import ENCODE_PATH
    from trtllm_gateway.engine.protocol import ImageInput

    red = Image.open(assets["media"] / "red.png").convert("RGB")
    body = b"".join(pixel_frames([ImageInput("red", red)]))
    r = httpx.post(
        f"{encoder.url}{ENCODE_PATH}",
        content=body,
        headers={"Content-Type": CONTENT_TYPE, **INTERNAL_AUTH},
    )
    assert r.status_code == 200, r.text
    embeds = "data:application/octet-stream;base64," + base64.b64encode(r.content).decode()
    client = openai.OpenAI(base_url=f"{vlm.url}/v1", api_key="unused", max_retries=0)
    content = [
        {"type": "image_embeds", "image_embeds": {"url": embeds}},
        {"type": "text", "text": "describe the picture"},
    ]
    got = client.chat.completions.create(
        model="model",
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        temperature=0,
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    want = ask(vlm, data_url(assets["red"]))
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.prompt_tokens == want.usage.prompt_tokens


def test_remote_encoding_equals_local_fallback(
    vlm: Server, encoder: Server, assets: dict[str, Any]
) -> None:
    def outcome(name: str) -> float:
        return vlm.metric("trtllm_gateway:remote_encode_total", f'outcome="{name}"')

    remote_before = outcome("remote")
    remote = ask(vlm, data_url(assets["red"])).choices[0].message.content
    assert '"path": "/internal/v1/encode", "status": 200' in encoder.log()
    assert outcome("remote") == remote_before + 1
    assert encoder.stop() == 0  # the sibling goes away: the next request encodes locally
    fallback_before = outcome("local_fallback")
    local = ask(vlm, data_url(assets["red"])).choices[0].message.content
    assert local == remote
    assert outcome("local_fallback") == fallback_before + 1


def test_bad_image_is_a_400_with_param(vlm: Server) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        ask(vlm, "data:image/png;base64,bm90IGFuIGltYWdl")
    body: Any = exc.value.body
    assert body["param"] == "messages[0].content[0].image_url"


def test_file_outside_allowed_path_is_refused(vlm: Server, tmp_path: Path) -> None:
    outside = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(outside)
    with pytest.raises(openai.BadRequestError):
        ask(vlm, f"file://{outside}")


def test_text_only_model_refuses_images(server: Server, assets: dict[str, Any]) -> None:
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": data_url(assets["red"])}}
                    ],
                }
            ]
        },
        timeout=30,
    )
    assert r.status_code == 400
    assert "model does not accept images" in r.json()["error"]["message"]
