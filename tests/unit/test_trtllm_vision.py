"""Contract tests: TrtllmEngine sends images in TensorRT-LLM's documented TextPrompt form (§2.2)
over the stand-in `tensorrt_llm`, on a tiny LLaVA checkpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.configs import trtllm_engine
from tests.engine.tiny_llava import IMAGE_TOKEN, build_tiny_llava, sample_images
from tests.standin import ensure_on_path
from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput, SamplingParams
from trtllm_gateway.engine.tokenizer import Tokenizer

ensure_on_path()

from trtllm_gateway.engine.trtllm.engine import TrtllmEngine  # noqa: E402


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("llava"), "llava")


@pytest.fixture
async def engine(llava_dir: Path) -> AsyncIterator[TrtllmEngine]:
    eng = trtllm_engine(engine="trtllm", model=str(llava_dir))
    await eng.start()
    yield eng
    await eng.stop()


def _prompt(llava_dir: Path) -> tuple[int, ...]:
    tok = Tokenizer.from_dir(llava_dir)
    content = [{"type": "image"}, {"type": "text", "text": "describe the picture"}]
    return tuple(tok.encode_chat([{"role": "user", "content": content}]))


async def _run(
    engine: TrtllmEngine, request_id: str, prompt: tuple[int, ...], image: object
) -> list[int]:
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    req = GenerateRequest(request_id, prompt, sp, (ImageInput(request_id, image),))
    return [t async for ev in engine.generate(req) for t in ev.token_ids]


async def test_images_go_as_a_text_prompt_with_multi_modal_data(
    engine: TrtllmEngine, llava_dir: Path
) -> None:
    assert engine.info.supports_images
    prompt = _prompt(llava_dir)
    red, gradient, _ = sample_images()
    out_red = await _run(engine, "a", prompt, red)
    sent = engine._llm.recorded_requests[-1]
    inputs = sent["inputs"]
    assert set(inputs) == {"prompt", "multi_modal_data"}
    assert inputs["prompt"] == f"USER: {IMAGE_TOKEN}\ndescribe the picture ASSISTANT:"
    assert inputs["multi_modal_data"] == {"image": [red]}
    assert sent["sampling_params"].add_special_tokens is False  # already in the decoded text
    assert await _run(engine, "b", prompt, gradient) != out_red
    assert await _run(engine, "c", prompt, red) == out_red


async def test_text_requests_stay_token_ids(engine: TrtllmEngine) -> None:
    req = GenerateRequest("t", (5, 6, 7), SamplingParams(max_tokens=2))
    _ = [ev async for ev in engine.generate(req)]
    assert engine._llm.recorded_requests[-1]["inputs"] == {"prompt_token_ids": [5, 6, 7]}
