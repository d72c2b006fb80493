"""Encode mode (EPD) on TensorRT-LLM over the stand-in: MultimodalEncoder behind the sibling
encode endpoint, and a TrtllmEngine that sends its images there (issue 21 item 8).

Real (1.2 period): MultimodalEncoder.generate_async(TextPrompt) gives an `mm_embedding_handle`
that `SharedTensorContainer.from_dict(handle).get_local_view()` opens on the same node only
(llmapi/mm_encoder.py, _torch/shared_tensor); precomputed embeddings enter generate_async as
`{"prompt": text, "multi_modal_embeddings": {"image": [tensor]}}` (llmapi/llm.py ->
attach_multimodal_embeddings, which wants the text model's hidden size).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import torch
from asgi_lifespan import LifespanManager

from tests.configs import (
    trtllm_encode_engine,
    trtllm_encode_engine_of,
    trtllm_engine,
    trtllm_engine_of,
)
from tests.conftest import wait_ready
from tests.engine.tiny_llava import IMAGE_TOKEN, build_tiny_llava, sample_images
from tests.standin import ensure_on_path
from tests.unit.test_trtllm_vision import _prompt
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.disagg.embed_tensors import frame_tensor, pixel_frames
from trtllm_gateway.engine.disagg.embed_wire import decode_frames, encode_frame
from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput, SamplingParams

ensure_on_path()

from tensorrt_llm import _scripted  # noqa: E402

from trtllm_gateway.engine.trtllm.engine import TrtllmEngine  # noqa: E402

LAYOUT = "trtllm:llava_next:hidden=64"


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("llava"), "llava_next")


@pytest.fixture
async def encode_app(llava_dir: Path) -> AsyncIterator[httpx.ASGITransport]:
    config = Settings(
        engine="trtllm", model=str(llava_dir), mode="encode", internal_api_key="int-key"
    ).parts()
    app = create_app(config, engine=trtllm_encode_engine_of(config))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://e") as client:
            await wait_ready(client)
        yield transport


def _image(i: int) -> ImageInput:
    return ImageInput(f"img-{i}", sample_images()[i])


async def test_encode_instance_answers_with_the_encoders_embeddings(llava_dir: Path) -> None:
    engine = trtllm_encode_engine(engine="trtllm", model=str(llava_dir), mode="encode")
    await engine.start()
    try:
        images = [_image(0), _image(1)]
        frames = list(
            decode_frames(
                b"".join(await engine.encode_images(b"".join(pixel_frames(images)))), "embeds"
            )
        )
        assert [f.header.image_hash for f in frames] == ["img-0", "img-1"]
        assert {f.header.layout for f in frames} == {LAYOUT}
        for img, frame in zip(images, frames, strict=True):
            want = _scripted.image_embedding(img.payload.convert("RGB").tobytes(), 4, 64)
            assert torch.equal(frame_tensor(frame), want)  # type: ignore[arg-type]
        sent = engine._encoder  # the MultimodalEncoder: mm_encoder_only, a TextPrompt each
        assert sent.args.mm_encoder_only is True
    finally:
        await engine.stop()


async def _run(
    engine: TrtllmEngine, request_id: str, prompt: tuple[int, ...], image: ImageInput
) -> list[int]:
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    req = GenerateRequest(request_id, prompt, sp, (image,))
    return [t async for ev in engine.generate(req) for t in ev.token_ids]


async def test_aggregated_instance_feeds_the_siblings_embeddings(
    llava_dir: Path, encode_app: httpx.ASGITransport
) -> None:
    """The images go to the encode sibling; its embeddings reach generate_async as
    multi_modal_embeddings, and the answer equals encoding locally."""
    local = trtllm_engine(engine="trtllm", model=str(llava_dir))
    remote = trtllm_engine(
        engine="trtllm",
        model=str(llava_dir),
        encode_url=["http://e"],
        internal_api_key="int-key",
    )
    await local.start()
    await remote.start()
    assert remote._remote_encode is not None
    remote._remote_encode.remote._client = httpx.AsyncClient(transport=encode_app)
    try:
        prompt = _prompt(llava_dir)
        want = await _run(local, "a", prompt, _image(1))
        got = await _run(remote, "b", prompt, _image(1))
        inputs = remote._llm.recorded_requests[-1]["inputs"]
        assert set(inputs) == {"prompt", "multi_modal_embeddings"}
        assert IMAGE_TOKEN in inputs["prompt"]
        (tensor,) = inputs["multi_modal_embeddings"]["image"]
        pixels = sample_images()[1].convert("RGB").tobytes()
        assert torch.equal(tensor, _scripted.image_embedding(pixels, 4, 64))  # type: ignore[arg-type]
        assert got == want
        assert remote.extras.remote_encode == {"remote": 1}
    finally:
        await local.stop()
        await remote.stop()


async def test_a_failed_encode_sibling_means_encoding_here(llava_dir: Path) -> None:
    engine = trtllm_engine(engine="trtllm", model=str(llava_dir), encode_url=["http://e"])
    await engine.start()
    assert engine._remote_encode is not None
    down = httpx.MockTransport(lambda _: httpx.Response(503, text="draining"))
    engine._remote_encode.remote._client = httpx.AsyncClient(transport=down)
    try:
        await _run(engine, "a", _prompt(llava_dir), _image(0))
        assert set(engine._llm.recorded_requests[-1]["inputs"]) == {"prompt", "multi_modal_data"}
        assert engine.extras.remote_encode == {"local_fallback": 1}
    finally:
        await engine.stop()


def _data_url(raw: bytes, mime: str) -> str:
    import base64

    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


async def test_image_embeds_parts_answer_as_their_image(llava_dir: Path, tmp_path: Path) -> None:
    """A client's precomputed embedding (an embed_wire file, as an encode sibling answers)
    from a data: URL or an allowed local file gives the image's answer; another layout, a
    file outside --allowed-local-media-path and a non-embedding are 400s naming the part."""
    import io

    encoder = trtllm_encode_engine(engine="trtllm", model=str(llava_dir), mode="encode")
    await encoder.start()
    image = sample_images()[1]
    (file_bytes,) = await encoder.encode_images(b"".join(pixel_frames([ImageInput("x", image)])))
    await encoder.stop()
    media = tmp_path / "media"
    media.mkdir()
    (media / "img.tgem").write_bytes(file_bytes)
    (tmp_path / "outside.tgem").write_bytes(file_bytes)
    png = io.BytesIO()
    image.save(png, format="PNG")

    config = Settings(
        engine="trtllm",
        model=str(llava_dir),
        served_model_name="llava",
        allowed_local_media_path=media,
    ).parts()
    app = create_app(config, engine=trtllm_engine_of(config))

    def chat(part: dict[str, object]) -> dict[str, object]:
        content = [part, {"type": "text", "text": "describe the picture"}]
        return {
            "model": "llava",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 6,
            "temperature": 0,
        }

    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await wait_ready(client)
            url = {
                "type": "image_url",
                "image_url": {"url": _data_url(png.getvalue(), "image/png")},
            }
            want = (await client.post("/v1/chat/completions", json=chat(url))).json()
            answer = want["choices"][0]["message"]["content"]
            for source in (
                _data_url(file_bytes, "application/octet-stream"),
                f"file://{media / 'img.tgem'}",
            ):
                part = {"type": "image_embeds", "image_embeds": {"url": source}}
                r = await client.post("/v1/chat/completions", json=chat(part))
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] == answer
            outside = {
                "type": "image_embeds",
                "image_embeds": f"file://{tmp_path / 'outside.tgem'}",
            }
            octet = "application/octet-stream"
            garbage = {"type": "image_embeds", "image_embeds": _data_url(b"not a frame", octet)}
            for part in (outside, garbage):
                r = await client.post("/v1/chat/completions", json=chat(part))
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == "messages[0].content[0].image_embeds"
            frame = next(iter(decode_frames(file_bytes, "embeds")))
            wrong = encode_frame(
                "embeds",
                "x",
                frame.header.dtype,
                frame.header.shape,
                frame.data,
                "trtllm:other:hidden=64",
            )
            part = {"type": "image_embeds", "image_embeds": _data_url(wrong, octet)}
            r = await client.post("/v1/chat/completions", json=chat(part))
            assert r.status_code == 400 and "layout" in r.json()["error"]["message"]
            # Our own layout string over a tensor of another width (issue 40): a 400 naming
            # the width, before TensorRT-LLM sees it.
            tokens, width = frame.header.shape
            narrow = encode_frame(
                "embeds", "x", "float32", (tokens, 7), bytes(tokens * 7 * 4), frame.header.layout
            )
            part = {"type": "image_embeds", "image_embeds": _data_url(narrow, octet)}
            r = await client.post("/v1/chat/completions", json=chat(part))
            assert r.status_code == 400, r.text
            assert f"[tokens, {width}]" in r.json()["error"]["message"]


async def test_an_encode_instance_refuses_generation_with_a_400(
    encode_app: httpx.ASGITransport,
) -> None:
    """An encode instance is an EngineBase, not an Engine: it has no generate/prefill to raise
    from; the serving dependency answers the generation routes."""
    async with httpx.AsyncClient(transport=encode_app, base_url="http://e") as client:
        for path, body in [
            (
                "/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            ),
            ("/v1/completions", {"model": "m", "prompt": "x"}),
        ]:
            r = await client.post(path, json=body)
            assert r.status_code == 400, r.text
            assert "only runs the vision encoder" in r.json()["error"]["message"]
