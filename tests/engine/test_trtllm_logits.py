"""Logits processors on the TensorRT-LLM adapter, over the stand-in's hook (tests/standin/
tensorrt_llm/_logits_hook.py: PyTorchModelEngine._execute_logit_post_processors as 1.2 calls
`SamplingParams.logits_processor`, pickled to the worker as executor/worker.py sends it).

The stand-in "model" is the real default model's directory, so the seeds' HelloWorld processor
encodes its answer with the real tokenizer and the stand-in's one-hot logits give way to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import pickle
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.configs import trtllm_engine
from tests.engine.conftest import chat_ids
from tests.standin import ensure_on_path
from trtllm_gateway.engine.logits.load import TEST_PROCESSOR
from trtllm_gateway.engine.logits.processor import ExtraArgs, LogitsProcessor, Row
from trtllm_gateway.engine.protocol import (
    GenerateRequest,
    InvalidRequestError,
    SamplingParams,
    TokenEvent,
)

ensure_on_path()

from trtllm_gateway.engine.trtllm.engine import TrtllmEngine  # noqa: E402
from trtllm_gateway.engine.trtllm.logits import TrtllmLogitsHook  # noqa: E402

HERE = "tests.engine.test_trtllm_logits"


class CountThenBan(LogitsProcessor[list[int]]):
    """vllm_xargs {"ban": id}: that id never comes; the state counts the calls it saw (in the
    worker's pickled copy). {"ban": -1} raises inside the hook."""

    def new_state(self, prompt_token_ids: Sequence[int], args: ExtraArgs) -> list[int] | None:
        ban = args.get("ban")
        if ban is None:
            return None
        if not isinstance(ban, int):
            raise ValueError("ban must be a token id")
        return [ban, 0]

    def apply(self, logits: torch.Tensor, rows: Sequence[Row[list[int]]]) -> None:
        assert logits.shape[0] == len(rows) == 1  # TensorRT-LLM calls the hook per request
        state = rows[0].state
        if state[0] < 0:
            raise RuntimeError("boom")
        state[1] += 1
        logits[0, state[0]] = float("-inf")


def _prompt(tokenizer: Any) -> tuple[int, ...]:
    return chat_ids(tokenizer, "What is the capital of France?")


@contextlib.asynccontextmanager
async def _engine(model_dir: Path, **kw: Any) -> AsyncIterator[TrtllmEngine]:
    engine = trtllm_engine(engine="trtllm", model=str(model_dir), **kw)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def _ids(engine: TrtllmEngine, req: GenerateRequest) -> tuple[list[int], list[TokenEvent]]:
    events = [ev async for ev in engine.generate(req)]
    return [t for ev in events for t in ev.token_ids], events


def _req(request_id: str, prompt: tuple[int, ...], **extra: Any) -> GenerateRequest:
    args = tuple(extra.items())
    return GenerateRequest(request_id, prompt, SamplingParams(max_tokens=24, extra_args=args))


async def test_hello_world_by_path_changes_the_selected_requests_only(
    model_dir: Path, tokenizer: Any
) -> None:
    prompt = _prompt(tokenizer)
    async with _engine(model_dir, logits_processor=[TEST_PROCESSOR]) as engine:
        hello, plain = await asyncio.gather(
            _ids(engine, _req("h", prompt, hello_world=1)), _ids(engine, _req("p", prompt))
        )
        recorded = engine._llm.recorded_requests
    assert tokenizer.decode(hello[0]) == "Hello world!"
    assert hello[1][-1].finish_reason == "stop"
    assert tokenizer.decode(plain[0]) != "Hello world!" and len(plain[0]) > 3
    hooks = [r["sampling_params"].logits_processor for r in recorded]
    assert sum(isinstance(h, TrtllmLogitsHook) for h in hooks) == 1 and hooks.count(None) == 1
    # What model_engine asserts of every post-processor before it calls one.
    assert len(inspect.signature(next(h for h in hooks if h)).parameters) == 5


async def test_seeds_env_var_answers_every_request(
    model_dir: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_ENABLE_TEST_LOGITS_PROCESSOR", "1")
    async with _engine(model_dir) as engine:
        ids, events = await _ids(engine, _req("r", _prompt(tokenizer)))
    assert tokenizer.decode(ids) == "Hello world!" and events[-1].finish_reason == "stop"


async def test_state_lives_in_the_workers_copy_and_failures_stay_in_the_hook(
    model_dir: Path, tokenizer: Any
) -> None:
    prompt = _prompt(tokenizer)
    async with _engine(model_dir, logits_processor=[f"{HERE}:CountThenBan"]) as engine:
        plain, _ = await _ids(engine, _req("p", prompt))
        banned, _ = await _ids(engine, _req("b", prompt, ban=plain[0]))
        # A processor that raises: the hook logs it and leaves the logits, as Dynamo's adapter
        # does, so TensorRT-LLM does not fail every request of the step; this one runs on.
        failing, _ = await _ids(engine, _req("f", prompt, ban=-1))
        with pytest.raises(InvalidRequestError) as refused:
            await _ids(engine, _req("x", prompt, ban="three"))
        hook = engine._llm.recorded_requests[1]["sampling_params"].logits_processor
    assert banned[0] != plain[0] and plain[0] not in banned
    assert failing == plain
    assert refused.value.param == "vllm_xargs"
    # The caller's hook was pickled to the worker: its state never counted a call.
    assert hook.bound[0].state == [plain[0], 0]


def _three_params(req_id: int, logits: torch.Tensor, token_ids: list[list[int]]) -> None:
    pass


def _raises(req_id: int, logits: Any, token_ids: Any, stream_ptr: Any, client_id: Any) -> None:
    raise RuntimeError("hook failed")


@pytest.mark.parametrize(
    ("hook", "why"), [(_three_params, "signature must match"), (_raises, "hook failed")]
)
async def test_the_standin_hook_is_as_strict_as_the_real_one(
    model_dir: Path, hook: Any, why: str
) -> None:
    """What the stand-in holds a hook to (model_engine's signature assert; an exception in the
    forward step fails every active request, PyExecutor._handle_errors; callables are pickled
    to the worker), so the adapter's own hook is known to meet it."""
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.executor.utils import RequestError

    llm = LLM(str(model_dir))
    bystander = llm.generate_async([8, 9], SamplingParams(max_tokens=40, end_id=0))
    hooked = llm.generate_async([5, 6, 7], SamplingParams(max_tokens=4, logits_processor=hook))
    with pytest.raises(RequestError, match=why):
        await hooked
    with pytest.raises(RequestError, match=why):
        await bystander
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        llm.generate_async([5], SamplingParams(logits_processor=lambda *a: None))
    llm.shutdown()
