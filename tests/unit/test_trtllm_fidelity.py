"""Issue 12: where a real TensorRT-LLM 1.2 differs from what the adapter once assumed.

Each test names the real behaviour the stand-in (tests/standin/tensorrt_llm) models and the
TensorRT-LLM or Dynamo source it comes from; each failed on the adapter before its fix.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from tests.configs import trtllm_args, trtllm_engine
from tests.standin import ensure_on_path
from tests.unit.test_trtllm_engine import _collect, _engine, _ids, _req, model_dir
from trtllm_gateway.engine.protocol import DisaggParams, GenerateRequest, InvalidRequestError

ensure_on_path()

from trtllm_gateway.engine.trtllm.stats import StatsPoller  # noqa: E402

__all__ = ["model_dir"]  # the fixture, re-used

LLAMA3_EOS = [128001, 128008, 128009]


def _llama3_dir(tmp_path: Path, max_len: int = 8192) -> Path:
    path = tmp_path / "llama-3.1"
    path.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "bos_token_id": 128000,
        "eos_token_id": LLAMA3_EOS,
        "max_position_embeddings": max_len,
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": LLAMA3_EOS}))
    return path


# -- 1. multi-EOS models ---------------------------------------------------------------------
async def test_multi_eos_model_stops_at_end_of_turn(tmp_path: Path) -> None:
    """Real: `end_id` is one id; TensorRT-LLM stops on it or on `stop_token_ids` only, so a
    Llama-3.x-Instruct turn ending in <|eot_id|> (128009, generation_config.json's last eos)
    runs to max_tokens unless the other EOS ids are sent (executor/request end_id semantics)."""
    engine = await _engine(_llama3_dir(tmp_path))
    try:
        events = await _collect(engine.generate(_req(prompt=(128000, 5, 6), max_tokens=200)))
        sent = engine._llm.recorded_requests[-1]["sampling_params"]
        assert sent.end_id == 128001
        assert set(sent.stop_token_ids) >= {128008, 128009}
        assert events[-1].finish_reason == "stop"
        # Reported like the built-in engine's EOS stops: the id is there, and render turns
        # only the user's own stop_token_ids into a stop_reason, so this is a plain stop.
        assert events[-1].stop_token_id == 128009
        assert len(_ids(events)) < 64
        assert not set(_ids(events)) & set(LLAMA3_EOS)
        # A user stop id is merged in, and still reported as the stop reason when hit.
        user = await _collect(
            engine.generate(_req("u", prompt=(128000, 5, 6), stop_token_ids=(_ids(events)[3],)))
        )
        assert user[-1].stop_token_id == _ids(events)[3]
        assert (
            engine._llm.recorded_requests[-1]["sampling_params"].stop_token_ids[0]
            == (_ids(events)[3])
        )
    finally:
        await engine.stop()


# -- 2. max_num_tokens -----------------------------------------------------------------------
def test_only_given_flags_reach_max_num_tokens_and_chunking(tmp_path: Path) -> None:
    """Real: TorchLlmArgs' own max_num_tokens default is 8192 (llm_args.py); the built-in
    engine's 2048 must not be sent unless the user gave --max-num-tokens."""
    args = trtllm_args(engine="trtllm", model=str(tmp_path))
    assert "max_num_tokens" not in args
    assert "enable_chunked_prefill" not in args
    given = trtllm_args(model=str(tmp_path), max_num_tokens=4096, enable_chunked_prefill=True)
    assert given["max_num_tokens"] == 4096
    assert given["enable_chunked_prefill"] is True


async def test_long_prompt_runs_with_trtllm_defaults(tmp_path: Path) -> None:
    """Real: the PyTorch backend rejects a prompt longer than max_num_tokens when chunked
    prefill is off (py_executor); with the default 8192 a 3,000-token prompt runs."""
    engine = await _engine(_llama3_dir(tmp_path))
    try:
        prompt = tuple(range(1000, 4000))
        events = await _collect(engine.generate(_req(prompt=prompt, max_tokens=4)))
        assert events[-1].finish_reason == "length" and len(_ids(events)) == 4
        assert engine._llm.recorded_requests[-1]["prompt_token_ids"] == list(prompt)
    finally:
        await engine.stop()


async def test_prompt_over_max_num_tokens_is_a_clear_400(tmp_path: Path) -> None:
    engine = await _engine(_llama3_dir(tmp_path), max_num_tokens=1024)
    try:
        with pytest.raises(InvalidRequestError, match=r"1500.*max_num_tokens.*1024"):
            await _collect(engine.generate(_req(prompt=tuple(range(1000, 2500)))))
        assert engine._llm.recorded_requests == []  # refused before TensorRT-LLM saw it
    finally:
        await engine.stop()


# -- 3. prefix-cache counters ----------------------------------------------------------------
def test_prefix_cache_counters_add_deltas_of_lifetime_totals() -> None:
    """Real: kvCacheStats.reusedBlocks/missedBlocks are running totals repeated in every
    iteration's stats (C++ KVCacheManager::getKvCacheStats via jsonSerialization.cpp)."""
    poller = StatsPoller(llm=None, kv_events=False)
    for reused, missed in ((2, 3), (2, 3), (2, 3), (5, 4)):
        poller._apply({"kvCacheStats": {"reusedBlocks": reused, "missedBlocks": missed}})
    assert poller.snapshot.prefix_cache_hits == 5
    assert poller.snapshot.prefix_cache_queries == 9


async def test_prefix_cache_health_over_the_standin(model_dir: Path) -> None:
    engine = await _engine(model_dir, block_size=2)
    try:
        # Real (kvCacheManager.cpp, WindowBlockManager::loadOrAllocateBlocks): every one of
        # the ceil(5/2) = 3 context blocks counts, reused or missed; keys cover the prompt less
        # its last token, so [5,6] and [7,8] can be reused and the block holding 9 never is.
        prompt = (5, 6, 7, 8, 9)
        for i in range(3):
            await _collect(engine.generate(_req(f"r{i}", prompt=prompt, max_tokens=12)))
        await asyncio.sleep(0.1)
        health = engine.health()
        assert (health.prefix_cache_hits, health.prefix_cache_queries) == (4, 9)
    finally:
        await engine.stop()


async def test_a_whole_cached_prompt_still_recomputes_its_last_token(model_dir: Path) -> None:
    """Real (WindowBlockManager::addSequence): block keys stop before the prompt's last token,
    so cached_tokens is at most len(prompt) - 1 even when every block was seen before."""
    engine = await _engine(model_dir, block_size=2)
    try:
        prompt = (5, 6, 7, 8)
        await _collect(engine.generate(_req("a", prompt=prompt, max_tokens=4)))
        events = await _collect(engine.generate(_req("b", prompt=prompt, max_tokens=4)))
        assert events[-1].usage is not None
        assert events[-1].usage.cached_tokens == 2  # [5,6] only: [7,8] holds the last token
    finally:
        await engine.stop()


async def test_end_id_stop_has_no_stop_reason_and_the_adapter_names_the_end_id(
    model_dir: Path,
) -> None:
    """Real (executor/result.py, GenerationResultBase._handle_sequence): FinishReason.END_ID
    gives finish_reason 'stop' and leaves stop_reason None; STOP_WORDS set it to the matched
    stop_token_ids entry. The adapter's TokenEvent names the id that stopped either way."""
    from tensorrt_llm import SamplingParams

    engine = await _engine(model_dir)
    try:
        prompt = [5, 6, 7]
        raw = await engine._llm.generate_async(
            {"prompt_token_ids": prompt}, SamplingParams(max_tokens=200)
        )
        assert raw.outputs[0].finish_reason == "stop"
        assert raw.outputs[0].stop_reason is None
        events = await _collect(engine.generate(_req("e", prompt=tuple(prompt), max_tokens=200)))
        assert events[-1].finish_reason == "stop"
        sent = engine._llm.recorded_requests[-1]["sampling_params"]
        assert events[-1].stop_token_id == sent.end_id
    finally:
        await engine.stop()


# -- 4. prompt logprobs ----------------------------------------------------------------------
async def test_prompt_logprobs_pair_entry_t_with_token_t_plus_1(model_dir: Path) -> None:
    """Real: prompt_logprobs holds one top-k dict per context position, entry t predicting
    token t+1, computed from context logits without the actual token: checked in
    tensorrt_llm/executor/result.py, compute_logprobs -> `_topk_logprobs(context_logits,
    k_prompt_logprobs, None)` (tokens=None: the prompt token is not added when outside the
    top k, unlike generation logprobs, which pass output_token_ids)."""
    from tensorrt_llm import _scripted

    engine = await _engine(model_dir)
    try:
        prompt = (5, 6, 7, 8, 9, 10)
        events = await _collect(
            engine.generate(_req(prompt=prompt, max_tokens=2, prompt_logprobs=2))
        )
        lps = events[0].prompt_logprobs
        assert lps is not None
        assert [lp.token_id for lp in lps] == list(prompt[1:])
        for t, lp in enumerate(lps):
            top = _scripted.prompt_topk(prompt, t, 2, 1000)
            assert lp.top == tuple(top)
            known = dict(top)
            if prompt[t + 1] in known:
                assert lp.logprob == known[prompt[t + 1]]
            else:  # not in TensorRT-LLM's top-k: unknown, never a made-up number
                assert math.isnan(lp.logprob)
    finally:
        await engine.stop()


# -- 5. logprobs 0 ---------------------------------------------------------------------------
async def test_zero_logprobs_still_returns_the_chosen_token(model_dir: Path) -> None:
    """Real: TensorRT-LLM tests logprobs for truth (`_get_output_config`), so 0 returns
    nothing; Dynamo sends max(1, k) and trims (handler_base.py). The adapter sends 20 (issue
    21: the top k never has the sampled token added) and trims to k."""
    engine = await _engine(model_dir)
    try:
        events = await _collect(engine.generate(_req(max_tokens=4, logprobs=0, temperature=0.0)))
        assert engine._llm.recorded_requests[-1]["sampling_params"].logprobs == 20
        lps = [lp for e in events for lp in e.logprobs or ()]
        assert [lp.token_id for lp in lps] == _ids(events)
        assert all(lp.top == () and lp.logprob < 0 for lp in lps)
    finally:
        await engine.stop()


# -- 7 and 9. disaggregation defaults and sibling compatibility ------------------------------
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_disagg_modes_bound_the_kv_transfer(tmp_path: Path, mode: str) -> None:
    """Real: without kv_transfer_timeout_ms a context request's blocks stay allocated until a
    generation request fetches them (CacheTransceiverConfig, llm_args.py)."""
    args = trtllm_args(engine="trtllm", model=str(tmp_path), mode=mode)
    assert args["cache_transceiver_config"]["kv_transfer_timeout_ms"] > 0


async def test_kv_layout_names_kv_dtype_and_block_size(model_dir: Path) -> None:
    """Dynamo troubleshooting: prefill and decode must agree on KV dtype and tokens_per_block."""
    a = await _engine(model_dir, block_size=64)
    b = await _engine(model_dir, override_engine_args='{"kv_cache_config": {"dtype": "fp8"}}')
    try:
        assert a.info.kv_layout != b.info.kv_layout
        assert "64" in a.info.kv_layout
        assert "fp8" in b.info.kv_layout
    finally:
        await a.stop()
        await b.stop()


# -- 10. first token's logprob on a disaggregated stream ---------------------------------------
async def test_generation_only_logprobs_are_refused_before_submitting(model_dir: Path) -> None:
    """Real: a generation-only result's token_ids start with first_gen_tokens, which have no
    logprob, and every non-cancelled response asserts `len(logprobs) == length`
    (executor/result.py, _handle_sequence): such a stream fails. Issue 21 item 2: the decode
    engine refuses it with a 400 before submitting (remote_prefill.py prefills it locally)."""
    prefill = await _engine(model_dir, mode="prefill")
    decode = await _engine(model_dir, mode="decode")
    try:
        req = _req("p", max_tokens=12, logprobs=1, ignore_eos=True)
        result = await prefill.prefill(req)
        disagg = DisaggParams(
            request_type="generation_only",
            first_token_ids=result.first_token_ids,
            first_logprobs=result.first_logprobs,
            opaque_state=result.opaque_state,
        )
        for sampling in (req.sampling, replace(req.sampling, logprobs=None, prompt_logprobs=0)):
            with pytest.raises(InvalidRequestError, match="prefill it locally"):
                await _collect(
                    decode.generate(
                        GenerateRequest("p", req.prompt_token_ids, sampling, disagg=disagg)
                    )
                )
        assert decode._llm.recorded_requests == []
        assert decode.health().state == "ready"
    finally:
        await prefill.stop()
        await decode.stop()


# -- 11. small ones --------------------------------------------------------------------------
async def test_log_level_reaches_tensorrt_llm_logger(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real: TensorRT-LLM logs through its own `tensorrt_llm.logger.logger` (set_level)."""
    import logging
    import os

    from tensorrt_llm.logger import logger as trt_logger

    monkeypatch.setattr(logging.getLogger("tensorrt_llm"), "level", logging.NOTSET)
    monkeypatch.setattr(trt_logger, "level", trt_logger.level)
    monkeypatch.setitem(os.environ, "TLLM_LOG_LEVEL", "")  # restored afterwards
    monkeypatch.delenv("TLLM_LOG_LEVEL")

    engine = await _engine(model_dir, log_level="error")
    try:
        assert trt_logger.level == "error"
        assert os.environ["TLLM_LOG_LEVEL"] == "ERROR"  # its MPI workers read this
    finally:
        await engine.stop()


async def test_abort_after_shutdown_does_not_raise_in_finally(model_dir: Path) -> None:
    """Real: GenerationResult.abort() calls the executor, which raises once llm.shutdown()
    ran; a stream still open at stop() must close quietly."""
    engine = await _engine(model_dir)
    gen = engine.generate(_req(max_tokens=50, ignore_eos=True))
    await anext(gen)  # type: ignore[arg-type]
    await engine.stop()
    engine.abort("r1")  # a late disconnect: idempotent, quiet
    await gen.aclose()  # type: ignore[attr-defined]


async def test_abort_while_tensorrt_llm_shuts_down_is_quiet(model_dir: Path) -> None:
    """Real (tensorrt_llm/executor/result.py, GenerationResult.abort): abort() calls
    `self._executor().abort_request(...)` through a weakref that LLM.shutdown() leaves dead, so
    it raises after shutdown, finished or not. stop() runs shutdown in a thread before it
    clears the adapter's LLM: a disconnect in that window must not escape."""
    engine = await _engine(model_dir)
    gen = engine.generate(_req(max_tokens=50, ignore_eos=True))
    await anext(gen)  # type: ignore[arg-type]
    result = next(iter(engine._inflight.results.values()))
    engine._llm.shutdown()  # TensorRT-LLM is down; the adapter has not cleared _llm yet
    with pytest.raises(AttributeError, match="abort_request"):
        result.abort()  # the stand-in fails as the real one does
    engine.abort("r1")
    await gen.aclose()  # type: ignore[attr-defined]
    await engine.stop()


async def test_stop_after_tensorrt_llm_died_under_an_open_stream(model_dir: Path) -> None:
    """stop() aborts what is in flight; when TensorRT-LLM's executor is already gone (a dead
    worker, a shutdown elsewhere), that abort raises (GenerationResult.abort, above) and stop()
    must still finish."""
    engine = await _engine(model_dir)
    gen = engine.generate(_req(max_tokens=50, ignore_eos=True))
    await anext(gen)  # type: ignore[arg-type]
    engine._llm.shutdown()
    await engine.stop()
    assert engine.health().state == "dead"
    await gen.aclose()  # type: ignore[attr-defined]


def test_kv_events_need_the_pytorch_backend(tmp_path: Path) -> None:
    """Real: KV cache events come from the PyTorch backend's KV cache manager; AutoDeploy
    does not publish them (TorchLlmArgs vs AutoDeploy's LlmArgs)."""
    from trtllm_gateway.config.engine_args import EngineArgsError

    with pytest.raises(EngineArgsError, match="--enable-kv-events"):
        trtllm_args(model=str(tmp_path), trtllm_backend="autodeploy", enable_kv_events=True)


# -- 12. no TensorRT-LLM ---------------------------------------------------------------------
def test_serve_without_tensorrt_llm_prints_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from trtllm_gateway.app.cli import main

    monkeypatch.setattr(
        "trtllm_gateway.web.logs.configure_logging", lambda *_a, **_k: None
    )  # keep caplog's
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import fails as if absent
    assert main(["serve", "--engine", "trtllm", "--model", "/nonexistent"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "needs TensorRT-LLM 1.2" in err[0]
    assert "Traceback" not in err[0]


# -- 6. the schema is TorchLlmArgs' ------------------------------------------------------------
REAL_1_2_KEYS = """\
fail_fast_on_attention_window_too_large: true
nvfp4_gemm_config: {allowed_backends: [cutlass]}
moe_config: {disable_finalize_fusion: true, use_low_precision_moe_combine: true}
"""
EAGLE3 = """\
speculative_config:
  decoding_type: Eagle3
  max_draft_len: 3
  speculative_model_dir: /models/eagle3
  eagle3_model_arch: mistral_large3
"""
LATER_KEYS = ("custom_tokenizer: deepseek_v32", "model_kwargs: {a: 1}", "env_overrides: {A: B}")


def _hide_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for name in [m for m in sys.modules if m.split(".")[0] == "tensorrt_llm"] + ["tensorrt_llm"]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("library", [True, False], ids=["TorchLlmArgs", "fallback-schema"])
def test_schema_matches_torch_llm_args_1_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: bool
) -> None:
    """Real: 1.2's TorchLlmArgs has MoeConfig.disable_finalize_fusion and
    use_low_precision_moe_combine, nvfp4_gemm_config, Eagle3's eagle3_model_arch and
    BaseLlmArgs' fail_fast_on_attention_window_too_large (1.2's commands/serve.py, get_llm_args,
    passes it to the PyTorch LLM on every start); custom_tokenizer, model_kwargs and
    env_overrides are a later version's (not in the 1.2-window llm_args.py: the harsher
    reading), so they are refused with that reason."""
    from trtllm_gateway.config.check import check_file
    from trtllm_gateway.config.engine_args import EngineArgsError
    from trtllm_gateway.config.trtllm_schema import validated_against

    if not library:
        _hide_tensorrt_llm(monkeypatch)
    assert ("TorchLlmArgs" in validated_against({})) is library
    for name, text in (("real.yaml", REAL_1_2_KEYS), ("eagle3.yaml", EAGLE3)):
        (tmp_path / name).write_text(text)
        check_file(tmp_path / name)
    for text in LATER_KEYS:
        (tmp_path / "later.yaml").write_text(text + "\n")
        key = text.split(":")[0]
        with pytest.raises(EngineArgsError, match=f"{key}: unknown key in TensorRT-LLM 1.2"):
            check_file(tmp_path / "later.yaml")
    (tmp_path / "nested.yaml").write_text("moe_config: {no_such_knob: 1}\n")
    with pytest.raises(EngineArgsError, match=r"moe_config\.no_such_knob"):
        check_file(tmp_path / "nested.yaml")


@pytest.mark.parametrize("library", [True, False], ids=["TorchLlmArgs", "fallback-schema"])
@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("speculative_config: {decoding_type: MTP, no_such_knob: 1}\n", "no_such_knob"),
        ("speculative_config: {decoding_type: Medusa2}\n", "speculative_config"),
        ("speculative_config: {decoding_type: Eagle3, max_draft_len: many}\n", "max_draft_len"),
        ("kv_connector_config: {connector_module: m}\n", "connector_scheduler_class"),
        ("torch_compile_config: {no_such_knob: true}\n", "no_such_knob"),
    ],
)
def test_nested_configs_are_typed_not_dicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: bool, yaml_text: str, key: str
) -> None:
    """Issue 35 item 6 (row 2): 1.2's TorchLlmArgs types speculative_config (`SpeculativeConfig`,
    a union keyed by decoding_type: MTP, Eagle/Eagle3, NGram, Draft_Target, ...),
    kv_connector_config (`KvCacheConnectorConfig`, three required strings) and
    torch_compile_config (`TorchCompileConfig`), all StrictBaseModel: an unknown key, an unknown
    decoding_type or a wrong type is refused (llmapi/llm_args.py). The stand-in typed them as
    plain dicts, so with it importable `config check` let these through."""
    from trtllm_gateway.config.check import check_file
    from trtllm_gateway.config.engine_args import EngineArgsError

    if not library:
        _hide_tensorrt_llm(monkeypatch)
    (tmp_path / "spec.yaml").write_text(yaml_text)
    with pytest.raises(EngineArgsError, match=key):
        check_file(tmp_path / "spec.yaml")


async def test_start_up_validates_with_torch_llm_args(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LLM is only built after the args pass TorchLlmArgs' own field types."""
    from trtllm_gateway.config.engine_args import EngineArgsError

    with pytest.raises(EngineArgsError, match=r"max_batch_size.*integer"):
        trtllm_engine(
            engine="trtllm",
            model=str(model_dir),
            override_engine_args='{"max_batch_size": "x"}',
        )


@pytest.mark.parametrize("library", [True, False], ids=["TorchLlmArgs", "fallback-schema"])
def test_autodeploy_keeps_its_own_keys(monkeypatch: pytest.MonkeyPatch, library: bool) -> None:
    """Real (tensorrt_llm/_torch/auto_deploy/llm_args.py, 1.2 window): AutoDeploy's LlmArgs has
    model_kwargs, model_factory and the rest of AutoDeployConfig; TorchLlmArgs has none of them.
    So they pass with the AutoDeploy backend (engine/trtllm/llm_args.py keeps them) and are
    refused without it; a key neither has is refused either way."""
    from trtllm_gateway.config.trtllm_schema import trtllm_args_errors

    if not library:
        _hide_tensorrt_llm(monkeypatch)
    own = {"model_kwargs": {"num_hidden_layers": 2}, "model_factory": "AutoModelForCausalLM"}
    assert trtllm_args_errors({"backend": "_autodeploy", **own}) == []
    torch_errors = {e["loc"][0]: e["msg"] for e in trtllm_args_errors(own)}
    assert "a later version's" in torch_errors["model_kwargs"]
    factory = torch_errors["model_factory"]
    assert factory == "unknown key" or "Extra inputs" in factory
    bad = trtllm_args_errors({"backend": "_autodeploy", "no_such_knob": 1})
    assert [e["loc"] for e in bad] == [("no_such_knob",)]
