"""Precomputed image embeddings (image_embeds parts) on the built-in engine, in process and
through the engine-core process: the same tokens as the image itself (issue 21 item 8)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.engine.conftest import EngineFactory, collect, embedder_of, greedy, on_vision_loop
from tests.engine.test_core_process import CoreFactory, make_core
from tests.engine.test_llava import chat_ids, engine_overrides
from tests.engine.tiny_llava import build_tiny_llava, sample_images
from trtllm_gateway.engine.disagg.embed_tensors import pixel_frames
from trtllm_gateway.engine.disagg.embed_wire import Frame
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
