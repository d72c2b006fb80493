"""Fixtures: the real default model (SmolLM2-135M) in fp32 on CPU, and an engine factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin.cpu_kernels import build
from trtllm_gateway.engine.builtin.engine import BuiltinEngine
from trtllm_gateway.engine.model_source import resolve_model
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams, TokenEvent

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain gravity to a child in one sentence.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return resolve_model("default")


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def chat_prompts(tokenizer: Any) -> list[list[int]]:
    out = []
    for p in PROMPTS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


# The CPU kernels' unit tests run each of these build variants. "native" is what this CPU
# selects: avx2 on CI's AVX2-only EPYC (so there every engine test runs the AVX2 path too) or
# avx512. "portable" is forced the way GATEWAY_CPU_ISA=portable forces it: the plain x86-64
# build for CPUs without AVX2 (and the code arm64 compiles), one extra build (1-4 minutes on
# two cores, cached like the native one). Other variants are not built here (CI time).
KERNEL_VARIANTS = ("native", "portable")


@pytest.fixture(scope="session", params=KERNEL_VARIANTS)
def kernels(request: pytest.FixtureRequest) -> Any:
    isa = build.select_isa() if request.param == "native" else request.param
    k = build.block_gemm(isa)
    assert k is not None, f"the {isa} CPU kernels must build here (make model builds native)"
    assert k.simd_path() == ("avx2" if isa == "avxvnni" else isa)  # the build is the variant
    return k


EngineFactory = Callable[..., BuiltinEngine]


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineFactory]:
    engines: list[BuiltinEngine] = []

    async def factory(**overrides: Any) -> BuiltinEngine:
        settings = Settings(**{"dtype": "float32", "device": "cpu", **overrides})
        engine = BuiltinEngine(settings)
        await engine.start()
        engines.append(engine)
        return engine

    yield factory  # type: ignore[misc]
    for e in engines:
        # No block may leak: everything finished or aborted has returned its blocks.
        h = e.health()
        assert h.running == 0 and h.waiting == 0, h
        assert h.kv_usage == 0.0 or e.settings.enable_prefix_caching, h
        await e.stop()


async def collect(engine: BuiltinEngine, req: GenerateRequest) -> list[TokenEvent]:
    return [ev async for ev in engine.generate(req)]


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)
