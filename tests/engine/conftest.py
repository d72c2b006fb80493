"""Fixtures: the real default model (SmolLM2-135M) in fp32 on CPU, and an engine factory.

The engine is what --no-engine-process serves: a CoreClient over the EngineCore in a thread, the
messages encoded as between processes, so every engine test runs the production message path.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.configs import builtin_config
from tests.in_thread import thread_core
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.builtin.cpu_kernels import build
from trtllm_gateway.engine.builtin.vision.embedder import ImageEmbedder
from trtllm_gateway.engine.model_source import resolve_model
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams, TokenEvent
from trtllm_gateway.engine.transport.client import CoreClient

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


# The CPU kernels' unit tests run each of these build variants: what this CPU selects ("native":
# avx512 or avx2), avx2 wherever the CPU runs it (so an AVX-512 CI machine tests the AVX2 path
# too, issue 28) and "portable", the plain x86-64 build for CPUs without AVX2 (and the code arm64
# compiles), each forced the way GATEWAY_CPU_ISA forces it and cached like the native one (1-4
# minutes each on two cores). GATEWAY_TEST_KERNEL_VARIANTS (comma-separated) replaces the list,
# e.g. "native,avxvnni" on a CPU with AVX-VNNI.
def _kernel_variants() -> tuple[str, ...]:
    asked = os.environ.get("GATEWAY_TEST_KERNEL_VARIANTS", "")
    if asked.strip():
        return tuple(v.strip() for v in asked.split(",") if v.strip())
    runnable = build.supported()
    extra = ("avx2",) if "avx2" in runnable and build.select_isa() != "avx2" else ()
    return ("native", *extra, "portable")


KERNEL_VARIANTS = _kernel_variants()


@pytest.fixture(scope="session", params=KERNEL_VARIANTS)
def kernels(request: pytest.FixtureRequest) -> Any:
    isa = build.select_isa() if request.param == "native" else request.param
    k = build.block_gemm(isa)
    assert k is not None, f"the {isa} CPU kernels must build here (make model builds native)"
    assert k.simd_path() == ("avx2" if isa == "avxvnni" else isa)  # the build is the variant
    return k


EngineFactory = Callable[..., Coroutine[Any, Any, CoreClient]]
T = TypeVar("T")


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineFactory]:
    engines: list[tuple[CoreClient, BuiltinConfig]] = []

    async def factory(**overrides: Any) -> CoreClient:
        config = builtin_config(**{"dtype": "float32", "device": "cpu", **overrides})
        engine = core_client(config, in_thread=True)
        await engine.start()
        engines.append((engine, config))
        return engine

    yield factory
    for e, config in engines:
        # No block may leak: everything finished or aborted has returned its blocks. The health
        # a batch carried may be a step old: the core's own is not.
        h = thread_core(e).health() if e.health().state == "ready" else e.health()
        assert h.running == 0 and h.waiting == 0, h
        assert h.kv_usage == 0.0 or config.engine.enable_prefix_caching, h
        await e.stop()
    engines.clear()  # nothing here keeps the stopped cores (tests/conftest.py collects them)


def loaded_model(engine: CoreClient) -> Any:
    """The model module the core loaded (its layers, PackedLinear or nn.Linear)."""
    loaded = thread_core(engine).loaded
    assert loaded is not None
    return loaded.model


def embedder_of(engine: CoreClient) -> ImageEmbedder:
    vision = thread_core(engine)._vision
    assert vision is not None
    return vision.embedder


async def on_vision_loop(engine: CoreClient, coro: Coroutine[Any, Any, T]) -> T:
    """Await coro on the core's vision thread, where its embedder lives."""
    vision = thread_core(engine)._vision
    assert vision is not None
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, vision.loop))


async def collect(engine: CoreClient, req: GenerateRequest) -> list[TokenEvent]:
    return [ev async for ev in engine.generate(req)]


def chat_ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    """One user turn through the model's chat template, as token ids."""
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tuple(tokenizer.encode(chat, add_special_tokens=False))


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)
