"""LLaVA on the built-in engine: greedy output equals transformers' token for token, image-aware
prefix caching, the embedding cache, placeholder checks, and text-only models refusing images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.conftest import EngineFactory, collect, embedder_of, greedy
from tests.engine.tiny_llava import build_tiny_llava, load_hf, sample_images
from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput, InvalidRequestError

MAX_TOKENS = 10


@pytest.fixture(scope="module", params=["llava", "llava_next"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("llava"), "llava")


def chat_ids(model_dir: Path, n_images: int, text: str = "describe the picture") -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": text}]
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return [int(t) for t in tok.encode(rendered, add_special_tokens=False)]


def images(*pils: Any) -> tuple[ImageInput, ...]:
    return tuple(ImageInput(hash=f"img-{id(p)}", payload=p) for p in pils)


def hf_greedy(model_dir: Path, ids: list[int], pils: list[Any], embeds_len: list[int]) -> list[int]:
    """transformers' LLaVA on the processor's pixels and the prompt expanded as its processor
    would (each image token repeated once per image feature)."""
    from transformers import AutoImageProcessor

    hf = load_hf(model_dir)
    pixels = AutoImageProcessor.from_pretrained(str(model_dir), backend="pil")(
        images=pils, return_tensors="pt"
    )
    lens = iter(embeds_len)
    expanded: list[int] = []
    for t in ids:
        expanded += [t] * next(lens) if t == hf.config.image_token_id else [t]
    input_ids = torch.tensor([expanded])
    out = hf.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=MAX_TOKENS,
        min_new_tokens=MAX_TOKENS,
        do_sample=False,
        **dict(pixels),
    )
    return [int(t) for t in out[0, len(expanded) :]]


def engine_overrides(model_dir: Path, **kw: Any) -> dict[str, Any]:
    # A 16-token step budget splits the prompt mid-image: chunked prefill takes image slices.
    return {
        "model": str(model_dir),
        "num_kv_blocks": 128,
        "block_size": 4,
        "max_num_tokens": 16,
        **kw,
    }


async def test_greedy_matches_transformers(tiny: Path, make_engine: EngineFactory) -> None:
    engine = await make_engine(**engine_overrides(tiny))
    assert engine.info.supports_images
    pils = sample_images()
    cases = [[pils[0]], [pils[1]], [pils[2], pils[0]]]  # one image each, then two in one prompt
    for i, case in enumerate(cases):
        ids = chat_ids(tiny, len(case))
        req = GenerateRequest(
            f"r{i}", tuple(ids), greedy(MAX_TOKENS, ignore_eos=True), images(*case)
        )
        events = await collect(engine, req)
        ours = [t for ev in events for t in ev.token_ids]
        lens = [e.shape[0] for e in embedder_of(engine).encoder.encode(case)]
        assert ours == hf_greedy(tiny, ids, case, lens), f"case {i}"
        usage = events[-1].usage
        assert usage is not None and usage.prompt_tokens == len(ids) - len(case) + sum(lens)


async def test_different_images_differ_same_image_hits_caches(
    llava_dir: Path, make_engine: EngineFactory
) -> None:
    engine = await make_engine(**engine_overrides(llava_dir))
    vision = embedder_of(engine)
    ids = tuple(chat_ids(llava_dir, 1))
    red, gradient, _ = sample_images()
    sp = greedy(MAX_TOKENS, ignore_eos=True)

    async def run(request_id: str, image: ImageInput) -> tuple[list[int], int]:
        events = await collect(engine, GenerateRequest(request_id, ids, sp, (image,)))
        usage = events[-1].usage
        assert usage is not None
        return [t for ev in events for t in ev.token_ids], usage.cached_tokens

    a, b = ImageInput("hash-red", red), ImageInput("hash-gradient", gradient)
    out_a, _ = await run("a", a)
    out_b, cached_b = await run("b", b)
    assert out_a != out_b
    # Same text, other image: only blocks before the image may come from the prefix cache.
    image_start = ids.index(vision.encoder.spec.image_token_id)
    assert cached_b <= image_start
    misses = vision.cache.misses
    out_a2, cached_a2 = await run("a2", a)
    assert out_a2 == out_a
    assert vision.cache.misses == misses and vision.cache.hits >= 1  # embedding cache hit
    assert cached_a2 > image_start  # image-aware prefix cache: the image's blocks are reused


async def test_placeholder_count_must_match_images(
    llava_dir: Path, make_engine: EngineFactory
) -> None:
    engine = await make_engine(**engine_overrides(llava_dir))
    ids = tuple(chat_ids(llava_dir, 1))
    two = images(*sample_images()[:2])
    with pytest.raises(InvalidRequestError, match="1 image placeholders but the request carries 2"):
        await collect(engine, GenerateRequest("x", ids, greedy(4), two))


async def test_max_tokens_capped_by_expanded_prompt(
    llava_dir: Path, make_engine: EngineFactory
) -> None:
    engine = await make_engine(**engine_overrides(llava_dir, max_model_len=48))
    ids = chat_ids(llava_dir, 1)  # 11 tokens, 26 once the image is expanded
    sp = greedy(48 - len(ids), ignore_eos=True)  # what the gateway sizes on the raw prompt
    events = await collect(
        engine, GenerateRequest("cap", tuple(ids), sp, images(sample_images()[0]))
    )
    usage = events[-1].usage
    assert usage is not None and usage.prompt_tokens + usage.completion_tokens == 48
    assert events[-1].finish_reason == "length"


async def test_text_only_model_refuses_images(make_engine: EngineFactory) -> None:
    engine = await make_engine(num_kv_blocks=64)
    assert not engine.info.supports_images
    req = GenerateRequest("t", (1, 2, 3), greedy(2), images(sample_images()[0]))
    with pytest.raises(InvalidRequestError, match="model does not accept images"):
        await collect(engine, req)
