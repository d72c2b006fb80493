"""Shared fixtures: a tiny byte-level BPE tokenizer with a ChatML template, settings, a FakeEngine,
the app built by create_app(settings.parts(), engine=fake), and an httpx client running its
lifespan."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from tests.fake_engine import FakeEngine
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import EngineInfo
from trtllm_gateway.engine.tokenizer import Tokenizer

MODEL = "tiny-model"
MAX_MODEL_LEN = 256
REPLY = "Hello world! 你好, café 😀🎉 done."
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog. STOP here.",
    "你好世界, こんにちは, 안녕하세요, café naïve résumé",
    "😀🎉🚀 emoji and more emoji 👍🏽",
]


# A started engine's core, its worker threads and their callbacks refer to each other, so a
# stopped engine's model and KV (2-3 GiB on CPU) go only when the cyclic collector runs, and its
# oldest generation runs rarely. Collect after a test that grew the process by 2 GiB since the
# last collection: a stopped engine's memory goes back to the allocator but rarely to the
# system, so the process stays 1-2 GiB above its last baseline after most engine tests, and at
# 1 GiB nearly every one of them paid a full collection.
#
# Everything the session has when collection ends (the imported modules: torch, transformers,
# fastapi...; the test items) lives to the end: frozen there, out of every later collection
# (after tests/api, a collection scanned 834k objects in 1.1-2.1 s; with the 484k the session
# had at the end of collection frozen, 350k in 0.45-0.9 s). No engine exists yet at that point,
# so none is frozen with its cycles. tests/api with four tests/engine files (317 tests), the two
# orders in turn on the 2-core VM: 246 -> 189 s and 216 -> 198 s; peak RSS 8.5 -> 10.2-10.5 GB.
_GROWTH = 2 << 30
_baseline = [0]


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()


def pytest_runtest_teardown(item: pytest.Item) -> None:
    rss = psutil.Process().memory_info().rss
    if rss > _baseline[0] + _GROWTH:
        gc.collect()
        _baseline[0] = psutil.Process().memory_info().rss
    elif rss < _baseline[0]:
        _baseline[0] = rss


def build_tokenizer_dir(path: Path) -> Path:
    """Train a ~400-token byte-level BPE in memory and save it like a model directory."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(_CORPUS * 5, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHATML
    hf.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer_dir(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tokenizer_dir)


@pytest.fixture
def settings(tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.delenv("GATEWAY_MODEL", raising=False)
    return Settings(
        model=str(tokenizer_dir),
        served_model_name=MODEL,
        max_model_len=MAX_MODEL_LEN,
    )


@pytest.fixture
def engine_info(tokenizer: Tokenizer) -> EngineInfo:
    eos = tokenizer.eos_token_id
    assert eos is not None
    return EngineInfo(
        model_id=MODEL,
        max_model_len=MAX_MODEL_LEN,
        vocab_size=tokenizer.vocab_size,
        eos_token_ids=(eos,),
        engine="fake",
    )


@pytest.fixture
def reply_ids(tokenizer: Tokenizer) -> list[int]:
    return tokenizer.encode(REPLY, add_special_tokens=False)


@pytest.fixture
def fake_engine(engine_info: EngineInfo, reply_ids: list[int], tokenizer_dir: Path) -> FakeEngine:
    return FakeEngine(engine_info, reply_ids, tokenizer_dir=tokenizer_dir, cached_tokens=3)


@pytest.fixture
def app(settings: Settings, fake_engine: FakeEngine) -> FastAPI:
    return create_app(settings.parts(), engine=fake_engine)


async def wait_ready(client: httpx.AsyncClient, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while (await client.get("/health")).status_code != 200:  # noqa: ASYNC110 - polls HTTP
            await asyncio.sleep(0.01)


@pytest.fixture
async def lifespan_app(app: FastAPI) -> AsyncIterator[FastAPI]:
    async with LifespanManager(app) as manager:
        yield manager.app  # type: ignore[misc]


@pytest.fixture
async def client(lifespan_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=lifespan_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        await wait_ready(client)
        yield client
