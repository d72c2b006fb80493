"""Precomputed image embeddings (image_embeds parts) on the built-in engine, in process and
through the engine-core process: the same tokens as the image itself (issue 21 item 8)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.engine.conftest import EngineFactory, collect, embedder_of, greedy, on_vision_loop
from tests.engine.test_core_process import CoreFactory, make_core
from tests.engine.test_llava import chat_ids, engine_overrides
from tests.engine.tiny_llava import build_tiny_llava, sample_images
from trtllm_gateway.engine.disagg.embed_tensors import DTYPES, pixel_frames
from trtllm_gateway.engine.disagg.embed_wire import Frame, decode_frames, encode_frame
from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput, InvalidRequestError
from trtllm_gateway.multimodal.embeds import decode_embeds

__all__ = ["make_core"]  # the fixture, re-used


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("llava"), "llava")


def _tokens(events: list) -> list[int]:  # type: ignore[type-arg]
    return [t for ev in events for t in ev.token_ids]


async def test_an_embedding_file_answers_as_its_image(
    llava_dir: Path, make_engine: EngineFactory, make_core: CoreFactory
) -> None:
    engine = await make_engine(**engine_overrides(llava_dir))
    image = ImageInput("img", sample_images()[1])
    # The file a client sends: what an encode sibling answers for the image.
    body = b"".join(pixel_frames([image]))
    (file_bytes,) = await on_vision_loop(engine, embedder_of(engine).encode_frames(body))
    embeds = decode_embeds(file_bytes)
    ids = tuple(chat_ids(llava_dir, 1))
    sp = greedy(8, ignore_eos=True)
    want = _tokens(await collect(engine, GenerateRequest("a", ids, sp, (image,))))
    assert _tokens(await collect(engine, GenerateRequest("b", ids, sp, (embeds,)))) == want
    # Through the engine-core process: the embedding crosses as its own embeds frame.
    core = await make_core(model=str(llava_dir))
    assert _tokens(await collect(core, GenerateRequest("c", ids, sp, (embeds,)))) == want
    # An embedding of another vision layout is a 400, not a silent mismatch.
    frame = embeds.payload
    assert isinstance(frame, Frame)
    other = replace(embeds, payload=Frame(replace(frame.header, layout="other:1:64"), frame.data))
    with pytest.raises(InvalidRequestError, match="layout"):
        await collect(engine, GenerateRequest("d", ids, sp, (other,)))


async def test_embeddings_the_model_cannot_take_are_a_400_and_the_engine_goes_on(
    llava_dir: Path, make_engine: EngineFactory
) -> None:
    """Issue 40 item 1: [5, 7] under this 64-wide model's own layout string reached the forward
    pass (`The expanded size of the tensor (64) must match ... (7)`) and the engine died; with
    the step contained, it failed the victims sharing its step instead (a 500 each)."""
    engine = await make_engine(**engine_overrides(llava_dir))
    layout = embedder_of(engine).layout
    width = int(layout.rpartition(":")[2])
    assert width == 64
    ids = tuple(chat_ids(llava_dir, 1))
    sp = greedy(8, ignore_eos=True)
    victim_image = ImageInput("img", sample_images()[0])
    alone = _tokens(await collect(engine, GenerateRequest("v0", ids, sp, (victim_image,))))

    def embeds(shape: tuple[int, ...], dtype: str = "float32", fill: float = 0.5) -> ImageInput:
        tensor = torch.full(shape, fill, dtype=DTYPES.get(dtype, torch.uint8))
        raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
        data = encode_frame("embeds", "x", dtype, shape, raw, layout)
        (frame,) = decode_frames(data, "embeds")  # as a client's file arrives at the engine
        return ImageInput(f"embeds-{shape}-{dtype}-{fill}", frame)

    hostile = {
        "narrow": embeds((5, 7)),
        "wide": embeds((5, width + 1)),
        "rank3": embeds((1, 5, width)),
        "empty": embeds((0, width)),
        "bytes": embeds((5, width), "uint8", fill=1),
        "nan": embeds((5, width), fill=float("nan")),
    }
    reqs = [GenerateRequest(k, ids, sp, (img,)) for k, img in hostile.items()]
    beside = [GenerateRequest(f"v{i}", ids, sp, (victim_image,)) for i in range(1, 3)]
    results = await asyncio.gather(
        *(collect(engine, r) for r in (*reqs, *beside)), return_exceptions=True
    )
    for name, got in zip(hostile, results, strict=False):
        assert isinstance(got, InvalidRequestError), (name, got)
        assert got.param == "messages", (name, got)
    assert "[tokens, 64]" in str(results[0]) and "NaN" in str(results[5])
    assert [_tokens(r) for r in results[len(reqs) :]] == [alone, alone]  # type: ignore[arg-type]
    # A float16 embedding of the right width is taken (converted to the model's dtype).
    ok = await collect(engine, GenerateRequest("ok", ids, sp, (embeds((5, width), "float16"),)))
    assert ok[-1].finish_reason == "length"
