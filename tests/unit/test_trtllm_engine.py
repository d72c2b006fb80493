"""Contract tests of TrtllmEngine over the stand-in `tensorrt_llm` (tests/standin).

A drift from the documented TensorRT-LLM 1.2 surface the stand-in reproduces (int request ids,
in-place streaming results, RequestError, context-only mutation, ...) fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.configs import resolve_args, trtllm_engine
from tests.standin import ensure_on_path
from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    DisaggParams,
    Engine,
    EngineDeadError,
    GenerateRequest,
    InvalidRequestError,
    SamplingParams,
    TokenEvent,
)

ensure_on_path()

from trtllm_gateway.engine.trtllm.engine import TrtllmEngine, TrtllmRequestError  # noqa: E402

VOCAB = 1000
EOS = 2


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-llama"
    path.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": VOCAB,
        "eos_token_id": EOS,
        "bos_token_id": 1,
        "max_position_embeddings": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


async def _engine(model_dir: Path, **kw: Any) -> TrtllmEngine:
    engine = trtllm_engine(engine="trtllm", model=str(model_dir), **kw)
    await engine.start()
    return engine


@pytest.fixture
async def engine(model_dir: Path) -> AsyncIterator[TrtllmEngine]:
    eng = await _engine(model_dir)
    yield eng
    await eng.stop()


def _req(request_id: str = "r1", prompt: tuple[int, ...] = (5, 6, 7), **sp: Any) -> GenerateRequest:
    return GenerateRequest(request_id, prompt, SamplingParams(**sp))


async def _collect(events: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    async with contextlib.aclosing(events):  # type: ignore[type-var]
        return [e async for e in events]


def _ids(events: list[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


async def test_is_an_engine_with_info_from_local_config(
    engine: TrtllmEngine, model_dir: Path
) -> None:
    assert isinstance(engine, Engine)
    assert engine.info.engine == "trtllm"
    assert engine.info.vocab_size == VOCAB
    assert engine.info.eos_token_ids == (EOS,)
    assert engine.info.max_model_len == 256
    assert engine.tokenizer_dir == model_dir
    assert engine.health().state == "ready"


async def test_streams_token_diffs_until_length(engine: TrtllmEngine) -> None:
    events = await _collect(engine.generate(_req(max_tokens=5)))
    assert len(_ids(events)) == 5
    assert all(len(e.token_ids) == 1 for e in events)  # diffs, not cumulative
    last = events[-1]
    assert last.finish_reason == "length"
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 5)
    assert last.timings is not None


async def test_deterministic_and_stops_on_end_id(engine: TrtllmEngine) -> None:
    a = await _collect(engine.generate(_req("a", max_tokens=200)))
    b = await _collect(engine.generate(_req("b", max_tokens=200)))
    assert _ids(a) == _ids(b)
    assert a[-1].finish_reason == "stop"
    assert a[-1].stop_token_id == EOS
    assert EOS not in _ids(a)
    ignored = await _collect(engine.generate(_req("c", max_tokens=100, ignore_eos=True)))
    assert ignored[-1].finish_reason == "length"
    assert len(_ids(ignored)) == 100


async def test_sampling_params_passed_as_documented(engine: TrtllmEngine) -> None:
    await _collect(engine.generate(_req(max_tokens=3, temperature=0.0, top_k=5, seed=7)))
    sent = engine._llm.recorded_requests[-1]
    sp = sent["sampling_params"]
    assert sent["streaming"] is True
    assert isinstance(sent["request_id"], int)
    assert sp.detokenize is False
    assert (sp.end_id, sp.max_tokens, sp.top_k, sp.seed, sp.temperature) == (EOS, 3, 5, 7, 0.0)
    assert sent["prompt_token_ids"] == [5, 6, 7]


async def test_stop_token_ids(engine: TrtllmEngine) -> None:
    tokens = _ids(await _collect(engine.generate(_req("a", max_tokens=6))))
    events = await _collect(engine.generate(_req("b", max_tokens=6, stop_token_ids=(tokens[2],))))
    assert _ids(events) == tokens[:2]
    assert events[-1].finish_reason == "stop"
    assert events[-1].stop_token_id == tokens[2]


async def test_logprobs_dict_form(engine: TrtllmEngine) -> None:
    req = _req(max_tokens=3, logprobs=2, prompt_logprobs=1, temperature=0.0)  # greedy: rank 1
    events = await _collect(engine.generate(req))
    lps = [lp for e in events for lp in e.logprobs or ()]
    assert [lp.token_id for lp in lps] == _ids(events)
    assert all(len(lp.top) == 2 and lp.top[0][0] == lp.token_id for lp in lps)
    assert all(lp.top[0][1] >= lp.top[1][1] for lp in lps)
    assert events[0].prompt_logprobs is not None
    assert [p.token_id for p in events[0].prompt_logprobs] == [6, 7]


async def test_logprobs_legacy_flat_form(
    engine: TrtllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorrt_llm.executor import result

    monkeypatch.setattr(result, "FLAT_LOGPROBS", True)
    events = await _collect(engine.generate(_req(max_tokens=2, logprobs=1)))
    lps = [lp for e in events for lp in e.logprobs or ()]
    assert len(lps) == 2
    assert all(lp.logprob < 0 and lp.top == ((lp.token_id, lp.logprob),) for lp in lps)


async def test_abort_ends_stream_with_abort(engine: TrtllmEngine) -> None:
    events = []
    gen = engine.generate(_req("x", max_tokens=50, ignore_eos=True))
    async with contextlib.aclosing(gen):  # type: ignore[type-var]
        async for event in gen:
            events.append(event)
            if len(events) == 2:
                engine.abort("x")
                engine.abort("x")  # idempotent
    assert events[-1].finish_reason == "abort"
    engine.abort("never-existed")


async def test_closing_the_generator_aborts_and_drains(engine: TrtllmEngine) -> None:
    gen = engine.generate(_req("x", max_tokens=50, ignore_eos=True))
    await gen.__anext__()
    result = engine._inflight.results["x"]
    await gen.aclose()  # type: ignore[attr-defined]
    assert result.aborted()
    assert "x" not in engine._inflight
    await asyncio.sleep(0.05)
    assert result.finished
    assert result.outputs[0].finish_reason == "cancelled"


async def test_cancelling_the_consumer_aborts(
    engine: TrtllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRTLLM_STANDIN_STEP_DELAY_S", "0.05")

    async def consume() -> None:
        await _collect(engine.generate(_req("c", max_tokens=50, ignore_eos=True)))

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.12)
    result = engine._inflight.results["c"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert result.aborted()


async def test_request_error_is_per_request(
    engine: TrtllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real (executor/base_worker.py _enqueue_request, 1.2): what its `try` raises becomes a
    RequestError for that request alone; the worker goes on."""
    from tensorrt_llm.executor.utils import RequestError

    worker = engine._llm._executor.worker
    enqueue = worker._enqueue_request

    def once(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(worker, "_enqueue_request", enqueue)
        raise RequestError("the request could not be built")

    monkeypatch.setattr(worker, "_enqueue_request", once)
    with pytest.raises(TrtllmRequestError, match="could not be built"):
        await _collect(engine.generate(_req()))
    assert engine.health().state == "ready"
    assert len(await _collect(engine.generate(_req("ok", max_tokens=2)))) == 2


async def test_an_executor_failure_kills_the_engine(
    engine: TrtllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real (executor/worker.py worker_main, executor/proxy.py submit, 1.2): an exception the
    worker raises outside BaseWorker._enqueue_request's `try` ends the worker, and the proxy
    raises Exception("Failed during generation: ...") from tensorrt_llm.executor."""

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access")

    streaming = engine.generate(_req("in-flight", max_tokens=200, ignore_eos=True))
    assert (await anext(streaming)).token_ids  # it runs
    monkeypatch.setattr(engine._llm._executor.worker, "_enqueue_request", boom)
    with pytest.raises(EngineDeadError):
        await _collect(engine.generate(_req()))
    health = engine.health()
    assert health.state == "dead"
    assert "illegal memory access" in health.detail
    with pytest.raises(EngineDeadError):
        await _collect(engine.generate(_req("again")))
    # The request in flight gets no further response from the dead worker (the stand-in,
    # as 1.2: executor/result.py): its stream ends with the engine's error, not a wait for ever.
    with pytest.raises(EngineDeadError, match="executor is gone"):
        async with asyncio.timeout(5):
            await _collect(streaming)


async def test_an_error_building_one_request_fails_only_it(
    engine: TrtllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35 item 2: an exception raised in-process before the executor sees the request
    (llmapi/llm.py generate_async's input processing) is that request's, not the engine's."""
    import tensorrt_llm.llmapi.llm as standin_llm

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("input processor")

    monkeypatch.setattr(standin_llm, "_prompt_token_ids", boom)
    with pytest.raises(TrtllmRequestError, match="input processor"):
        await _collect(engine.generate(_req()))
    assert engine.health().state == "ready"
    monkeypatch.undo()
    assert len(await _collect(engine.generate(_req("ok", max_tokens=2)))) == 2


async def test_invalid_requests(engine: TrtllmEngine) -> None:
    with pytest.raises(ContextTooLongError):
        await _collect(engine.generate(_req(prompt=tuple(range(10, 210)), max_tokens=100)))
    with pytest.raises(InvalidRequestError, match="empty"):
        await _collect(engine.generate(_req(prompt=())))


async def test_stats_feed_health(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_STANDIN_STEP_DELAY_S", "0.02")
    engine = await _engine(model_dir)
    try:
        gen = engine.generate(_req(max_tokens=20, ignore_eos=True))
        async with contextlib.aclosing(gen):  # type: ignore[type-var]
            seen = 0
            async for _ in gen:
                seen += 1
                if seen == 5:
                    await asyncio.sleep(0.05)
                    health = engine.health()
                    assert health.kv_usage > 0
                    assert health.running == 1
    finally:
        await engine.stop()
    assert engine.health().state == "dead"


async def test_kv_events_stream(model_dir: Path) -> None:
    engine = await _engine(model_dir, enable_kv_events=True, block_size=2)
    try:
        events = engine.kv_events()
        waiter = asyncio.create_task(anext(events))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        await _collect(engine.generate(_req(prompt=(5, 6, 7, 8, 9), max_tokens=2)))
        event = await asyncio.wait_for(waiter, 3)
        assert event["data"]["type"] == "created"  # 1.2: the cache's creation comes first
        event = await asyncio.wait_for(anext(events), 3)  # type: ignore[arg-type]
        assert event["data"]["type"] == "stored"
        await events.aclose()  # type: ignore[attr-defined]
    finally:
        await engine.stop()


async def test_prefill_then_decode_matches_aggregated(
    model_dir: Path, engine: TrtllmEngine
) -> None:
    prefill = await _engine(model_dir, mode="prefill")
    decode = await _engine(model_dir, mode="decode")
    try:
        req = _req("p", max_tokens=6, logprobs=1)
        result = await prefill.prefill(req)
        sent = prefill._llm.recorded_requests[-1]
        assert sent["sampling_params"].max_tokens == 1
        assert sent["disaggregated_params"].request_type == "context_only"
        assert len(result.first_token_ids) == 1
        assert result.first_logprobs is not None
        state = json.loads(result.opaque_state)
        assert isinstance(state["ctx_request_id"], int)

        disagg = DisaggParams(
            request_type="generation_only",
            first_token_ids=result.first_token_ids,
            opaque_state=result.opaque_state,
        )
        plain = SamplingParams(max_tokens=6)  # no logprobs: refused on a hand-off (issue 21)
        decoded = await _collect(
            decode.generate(GenerateRequest("p", req.prompt_token_ids, plain, disagg=disagg))
        )
        sent = decode._llm.recorded_requests[-1]
        assert sent["disaggregated_params"].request_type == "generation_only"
        assert sent["prompt_token_ids"] == list(req.prompt_token_ids)
        aggregated = await _collect(engine.generate(_req("p", max_tokens=6)))
        assert _ids(decoded) == _ids(aggregated)
        assert decoded[0].token_ids[0] == result.first_token_ids[0]
    finally:
        await prefill.stop()
        await decode.stop()


async def test_decode_rejects_foreign_or_mismatched_state(model_dir: Path) -> None:
    prefill = await _engine(model_dir, mode="prefill")
    decode = await _engine(model_dir, mode="decode")
    try:
        result = await prefill.prefill(_req("p"))
        bad = DisaggParams(request_type="generation_only", opaque_state=b"not ours")
        with pytest.raises(InvalidRequestError):
            await _collect(decode.generate(GenerateRequest("d1", (5, 6, 7), disagg=bad)))
        other = DisaggParams(request_type="generation_only", opaque_state=result.opaque_state)
        with pytest.raises(TrtllmRequestError, match="KV cache transfer"):
            await _collect(decode.generate(GenerateRequest("d2", (9, 9, 9), disagg=other)))
        assert decode.health().state == "ready"
    finally:
        await prefill.stop()
        await decode.stop()


async def test_aggregated_instance_refuses_prefill(engine: TrtllmEngine) -> None:
    with pytest.raises(InvalidRequestError, match="transceiver"):
        await engine.prefill(_req())


def test_encode_instance_asking_an_encode_sibling_is_refused(model_dir: Path) -> None:
    """--encode-url is for prefill and aggregated instances (EPD: engine.trtllm.encode)."""
    from trtllm_gateway.config.disagg import encode_siblings
    from trtllm_gateway.engine.trtllm.loader import TrtllmUnsupportedError, refuse_unsupported

    config = resolve_args("--engine", "trtllm", "--mode", "encode", "--encode-url", "http://e")
    with pytest.raises(TrtllmUnsupportedError, match="--encode-url"):
        refuse_unsupported(config.engine, encode_siblings(config.disagg))


async def test_autodeploy_backend_prunes_args(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await _engine(model_dir, trtllm_backend="autodeploy", tensor_parallel_size=2)
    try:
        assert type(engine._llm).__module__ == "tensorrt_llm._torch.auto_deploy"
        warned = [r.getMessage() for r in caplog.records if "autodeploy" in r.getMessage()]
        assert any("`tensor_parallel_size`" in m for m in warned)
        assert any("`scheduler_config`" in m for m in warned)
        assert len(await _collect(engine.generate(_req(max_tokens=2)))) == 2
    finally:
        await engine.stop()


async def test_decode_skips_the_engine_when_context_already_finished(model_dir: Path) -> None:
    decode = await _engine(model_dir, mode="decode")
    try:
        body = {
            "format": "trtllm-disagg/1",
            "kind": "context",
            "ctx_request_id": 3,
            "first_gen_tokens": [42],
            "draft_tokens": None,
            "encoded_opaque_state": None,
            "finish_reason": "stop",
        }
        state = json.dumps(body).encode()
        params = DisaggParams(request_type="generation_only", opaque_state=state)
        req = GenerateRequest("d", (5, 6), SamplingParams(), disagg=params)
        events = await _collect(decode.generate(req))
        assert [e.finish_reason for e in events] == ["stop"]
        assert events[0].token_ids == (42,)
        assert decode._llm.recorded_requests == []
    finally:
        await decode.stop()


async def test_info_max_batch_size_follows_the_layered_args(model_dir: Path) -> None:
    """A --override (or YAML) max_batch_size wins over the flag, and info reports the winner:
    the gateway sizes admission from it."""
    eng = await _engine(model_dir, max_batch_size=64, override_engine_args='{"max_batch_size": 3}')
    try:
        assert eng.info.max_batch_size == 3
    finally:
        await eng.stop()
