"""Issue 21: what a real TensorRT-LLM 1.2 deployment hits in its first hour.

Each test names the real behaviour the stand-in (tests/standin/tensorrt_llm) now models, with
the upstream file and function; each failed against the corrected stand-in before the adapter
was fixed. Sources: NVIDIA/TensorRT-LLM (1.2 period) and ai-dynamo/dynamo 0.8.1.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.configs import gateway, trtllm_engine_of
from tests.standin import ensure_on_path
from tests.unit.test_trtllm_engine import _collect, _engine, _ids, _req, model_dir
from tests.upstream.dynamo_zmq_wire import decode_batch
from trtllm_gateway.config.engine_args import resolve_trtllm_args
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.disagg.prefix_index import PrefixIndex
from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine
from trtllm_gateway.engine.kv_events.log import AllBlocksCleared, BlockRemoved, BlockStored
from trtllm_gateway.engine.kv_events.wire import dynamo_payload
from trtllm_gateway.engine.protocol import GenerateRequest, InvalidRequestError, SamplingParams
from trtllm_gateway.engine.stats import RemotePrefillStats

ensure_on_path()

from tensorrt_llm import SamplingParams as TrtSamplingParams  # noqa: E402
from tensorrt_llm import _scripted  # noqa: E402
from tensorrt_llm.executor.result import RequestOutput  # noqa: E402

from trtllm_gateway.engine.trtllm.engine import TrtllmRequestError  # noqa: E402

__all__ = ["model_dir"]  # the fixture, re-used


# -- 1. sampled logprobs ---------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 2])
async def test_sampled_tokens_outside_the_top_k_are_unknown_not_the_floor(
    model_dir: Path, k: int
) -> None:
    """Real: the 1.2-period TorchSampler stores only `torch.topk(log_softmax(logits),
    k=py_num_logprobs)` per step and handle_logprobs never adds the sampled token
    (tensorrt_llm/_torch/pyexecutor/sampler.py). At OpenAI's default temperature 1.0 the
    sampled token is often outside a top-1. The adapter asks for the top 20 (OpenAI's most);
    a token still outside is unknown (NaN), never -9999 presented as its value."""
    engine = await _engine(model_dir)
    try:
        events = await _collect(engine.generate(_req(max_tokens=40, logprobs=k, ignore_eos=True)))
        sent = engine._llm.recorded_requests[-1]["sampling_params"]
        assert sent.logprobs >= 20
        lps = [lp for e in events for lp in e.logprobs or ()]
        assert [lp.token_id for lp in lps] == _ids(events)
        known = unknown = 0
        for position, lp in enumerate(lps):
            rank = _scripted.sampled_rank(lp.token_id, position, greedy=False)
            assert lp.logprob != -9999.0
            if rank <= sent.logprobs:
                assert lp.logprob == _scripted.logprob_at(lp.token_id, position, rank)
                known += 1
            else:
                assert math.isnan(lp.logprob)
                unknown += 1
            assert len(lp.top) == k  # trimmed back to what was asked
            assert [r for r, _ in enumerate(lp.top, 1)] == list(range(1, k + 1))
        assert known and unknown  # both cases occur in this run
    finally:
        await engine.stop()


async def test_greedy_logprobs_are_all_known(model_dir: Path) -> None:
    """Real: under greedy decoding (params_imply_greedy_decoding) the sampled token is the
    argmax, rank 1, so it is always in the stored top k."""
    engine = await _engine(model_dir)
    try:
        req = _req(max_tokens=20, logprobs=0, temperature=0.0, ignore_eos=True)
        lps = [lp for e in await _collect(engine.generate(req)) for lp in e.logprobs or ()]
        assert lps and all(not math.isnan(lp.logprob) and lp.logprob < 0 for lp in lps)
    finally:
        await engine.stop()


# -- 2. one request's failure is that request's ------------------------------------------------
async def test_an_exception_inside_one_stream_fails_only_that_request(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real: GenerationResult raises from inside a request's iteration for per-request reasons
    (executor/result.py asserts on each response, e.g. `len(output.logprobs) ==
    output.length`). That is the request's error, never the engine's death (503 for all)."""
    engine = await _engine(model_dir)
    advance = RequestOutput._advance

    def failing(self: RequestOutput) -> None:
        if self.request_id == 1:
            raise AssertionError
        advance(self)

    monkeypatch.setattr(RequestOutput, "_advance", failing)
    try:
        with pytest.raises(TrtllmRequestError):
            await _collect(engine.generate(_req("bad", max_tokens=4)))
        assert engine.health().state == "ready"
        events = await _collect(engine.generate(_req("good", max_tokens=4)))
        assert events[-1].finish_reason == "length"
    finally:
        await engine.stop()


async def test_decode_instance_prefills_logprob_requests_locally(model_dir: Path) -> None:
    """Item 2 at admission: a TensorRT-LLM decode instance keeps a logprobs (or echo) request
    local, so every token has its logprob, instead of a sibling hand-off that 1.2 fails."""

    def sibling(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/internal/v1/prefill":
            raise AssertionError("a logprobs request must not be sent to a sibling")
        return httpx.Response(503)

    config = Settings(
        engine="trtllm",
        model=str(model_dir),
        mode="decode",
        prefill_url=["http://p1"],
        max_local_prefill_tokens=0,
    ).parts()
    stats = RemotePrefillStats()
    engine = RemotePrefillEngine(
        trtllm_engine_of(config), config.disagg, stats, transport=httpx.MockTransport(sibling)
    )
    await engine.start()
    try:
        req = _req(max_tokens=6, logprobs=1, prompt_logprobs=1, temperature=0.0)
        events = await _collect(engine.generate(req))
        lps = [lp for e in events for lp in e.logprobs or ()]
        assert len(lps) == len(_ids(events)) == 6
        assert events[0].prompt_logprobs is not None
        assert stats.outcomes["local_logprobs"] == 1
    finally:
        await engine.stop()


# -- 4. built-in defaults stay out of TensorRT-LLM -------------------------------------------
async def test_max_batch_size_is_tensorrt_llms_unless_given(model_dir: Path) -> None:
    """Real: TorchLlmArgs.max_batch_size defaults to 2048 (llmapi/llm_args.py); the built-in
    engine's 64 sent on every start would silently cap concurrency at 64."""
    engine = await _engine(model_dir)
    try:
        assert "max_batch_size" not in engine._args
        assert engine._llm.args.max_batch_size == 2048
        assert engine.info.max_batch_size == 2048  # admission is sized from it
    finally:
        await engine.stop()
    engine = await _engine(model_dir, max_batch_size=8)
    try:
        assert engine._llm.args.max_batch_size == 8 == engine.info.max_batch_size
    finally:
        await engine.stop()


@pytest.mark.parametrize(
    ("flags", "yaml_text", "tokens"),
    [
        ({}, "", 100 * 32),  # TensorRT-LLM's tokens_per_block default: 32, not the built-in 16
        ({"block_size": 64}, "", 100 * 64),
        ({}, "kv_cache_config:\n  tokens_per_block: 16\n", 100 * 16),
        ({}, "kv_cache_config:\n  max_tokens: 999\n", 999),  # the YAML's own value wins
    ],
)
async def test_num_kv_blocks_converts_with_the_engines_block_size(
    model_dir: Path, tmp_path: Path, flags: dict[str, int], yaml_text: str, tokens: int
) -> None:
    """Real: KvCacheConfig.tokens_per_block defaults to 32 (llm_args.py) and the cache holds
    max_tokens // tokens_per_block blocks (KVCacheManager); --num-kv-blocks 100 is 100 of them."""
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml_text or "{}\n")
    engine = await _engine(model_dir, num_kv_blocks=100, extra_engine_args=extra, **flags)
    try:
        kv = engine._llm.args.kv_cache_config
        assert kv.max_tokens == tokens
        await _collect(engine.generate(_req(max_tokens=2)))
        stats = await anext(aiter(engine._llm.get_stats_async(timeout=1)))
        assert stats["kvCacheStats"]["maxNumBlocks"] == tokens // kv.tokens_per_block
    finally:
        await engine.stop()


# -- 5. the 1.2 schema as it is --------------------------------------------------------------
@pytest.mark.parametrize("library", [True, False], ids=["TorchLlmArgs", "fallback-schema"])
@pytest.mark.parametrize(
    ("yaml_text", "reason"),
    [
        (
            "scheduler_config: {waiting_queue_policy: fcfs}\n",
            r"scheduler_config.waiting_queue_policy: unknown key in TensorRT-LLM 1.2 .*1.3",
        ),
        (
            "scheduler_config:\n  dynamic_batch_config: {enable_batch_size_tuning: false}\n",
            r"scheduler_config.dynamic_batch_config.enable_max_num_tokens_tuning: Field required",
        ),
        (
            "cache_transceiver_config: {backend: UCX, kv_transfer_timeout_ms: 0}\n",
            r"cache_transceiver_config.kv_transfer_timeout_ms: Input should be greater than 0",
        ),
    ],
    ids=["waiting_queue_policy", "partial-dynamic-batch", "zero-kv-timeout"],
)
def test_values_1_2_refuses_are_refused_at_our_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: bool, yaml_text: str, reason: str
) -> None:
    """Issue 35 item 4, TensorRT-LLM 1.2.0 as released (llmapi/llm_args.py of the 1.2 window):
    SchedulerConfig has no waiting_queue_policy (1.3 added it with WaitingQueuePolicy.FCFS) and
    is extra="forbid"; DynamicBatchConfig's three fields are required (1.3 defaults them);
    CacheTransceiverConfig.kv_transfer_timeout_ms is `Field(default=None, gt=0)`. Each is
    refused by `config check` and by serve's start, naming the file, the key and why."""
    from tests.unit.test_trtllm_fidelity import _hide_tensorrt_llm
    from trtllm_gateway.config.check import check_file
    from trtllm_gateway.config.engine_args import EngineArgsError

    if not library:
        _hide_tensorrt_llm(monkeypatch)
    path = tmp_path / "engine.yaml"
    path.write_text(yaml_text)
    with pytest.raises(EngineArgsError, match=rf"engine.yaml: {reason}"):
        check_file(path)
    config = gateway(engine="trtllm", extra_engine_args=path)
    with pytest.raises(EngineArgsError, match=reason):
        resolve_trtllm_args(config.engine, config.trtllm)


async def test_a_whole_dynamic_batch_config_starts(model_dir: Path, tmp_path: Path) -> None:
    """All three DynamicBatchConfig fields (1.2 requires each) reach the LLM as given."""
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "scheduler_config:\n  dynamic_batch_config: {enable_batch_size_tuning: false,\n"
        "    enable_max_num_tokens_tuning: true, dynamic_batch_moving_average_window: 64}\n"
    )
    engine = await _engine(model_dir, extra_engine_args=extra)
    try:
        dyn = engine._llm.args.scheduler_config.dynamic_batch_config
        assert (
            dyn.enable_batch_size_tuning,
            dyn.enable_max_num_tokens_tuning,
            dyn.dynamic_batch_moving_average_window,
        ) == (False, True, 64)
    finally:
        await engine.stop()


async def test_cuda_graph_batch_sizes_flag_starts(model_dir: Path) -> None:
    """Real: TorchLlmArgs.validate_cuda_graph_config (1.2 period) refuses batch_sizes together
    with a max_batch_size unless the list equals the one it would generate ("Please don't set
    both"); --cuda-graph-batch-sizes 1,2,4,8 must send the list alone."""
    engine = await _engine(model_dir, cuda_graph_batch_sizes=[1, 2, 4, 8])
    try:
        assert engine._llm.args.cuda_graph_config.batch_sizes == [1, 2, 4, 8]
    finally:
        await engine.stop()


@pytest.mark.parametrize("library", [True, False], ids=["TorchLlmArgs", "fallback-schema"])
@pytest.mark.parametrize(
    "yaml_text",
    [
        "tokenizer_mode: fast\n",
        "orchestrator_type: mpi\n",
        "allreduce_strategy: FASTEST\n",
        "kv_cache_config: {max_attention_window: []}\n",
        "kv_cache_config: {max_attention_window: [0, 512]}\n",
        "kv_cache_config: {mamba_ssm_cache_dtype: fp8}\n",
        "guided_decoding_backend: outlines\n",
        "cuda_graph_config: {batch_sizes: [1, 2, 4, 8], max_batch_size: 8}\n",
        # CudaGraphConfig._generate_cuda_graph_batch_sizes ends with max_batch_size itself, so
        # 100 generates [1..32, 64, 100]: this list is not it (the stand-in once forgot that).
        f"cuda_graph_config: {{batch_sizes: {[*range(1, 33), 64]}, max_batch_size: 100}}\n",
    ],
)
def test_typed_fields_refuse_what_1_2_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: bool, yaml_text: str
) -> None:
    """The stand-in's TorchLlmArgs carries llm_args.py's field types (no longer Any), so the
    schema is checked against 1.2 rather than against itself; both paths refuse these."""
    from tests.unit.test_trtllm_fidelity import _hide_tensorrt_llm
    from trtllm_gateway.config.check import check_file
    from trtllm_gateway.config.engine_args import EngineArgsError

    if not library:
        _hide_tensorrt_llm(monkeypatch)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(EngineArgsError):
        check_file(path)


# -- 3. partial KV blocks and attention-DP ranks --------------------------------------------
async def _kv_records(engine: Any, after: int = -1) -> list[Any]:
    for _ in range(100):
        records, _lost = engine.kv_event_log.since(after)
        if records and not isinstance(records[-1].event, AllBlocksCleared):
            await asyncio.sleep(0.05)  # let the rest of this request's events arrive
            return engine.kv_event_log.since(after)[0]
        await asyncio.sleep(0.03)
    return []


async def test_partial_blocks_never_reach_the_prefix_index(model_dir: Path) -> None:
    """Real: stored runs may end in a partial block (fewer than tokens_per_block tokens;
    kvCacheEventManager.cpp), and Dynamo's publisher (dynamo/trtllm/publisher.py) stops each
    run at its first partial block, remembering its hash so its removal is not sent. The
    adapter once took block_size from the first block: a 10-token prompt made it 9."""
    engine = await _engine(model_dir, enable_kv_events=True, num_kv_blocks=3)
    index = PrefixIndex()
    try:
        await _collect(engine.generate(_req("short", prompt=tuple(range(3, 13)), max_tokens=2)))
        await asyncio.sleep(0.3)
        records, _ = engine.kv_event_log.since(-1)
        assert not [r for r in records if isinstance(r.event, BlockStored)]
        assert engine.kv_event_log.block_size == 32
        long_prompt = tuple(range(20, 90))  # 69 keyed tokens: 2 full blocks and a partial one
        await _collect(engine.generate(_req("long", prompt=long_prompt, max_tokens=2)))
        records = await _kv_records(engine)
        stored = [r.event for r in records if isinstance(r.event, BlockStored)]
        assert len(stored) == 1 and stored[0].block_size == 32
        assert stored[0].token_ids == long_prompt[:64] and len(stored[0].block_hashes) == 2
        for rec in records:
            index.apply(rec.event)
        assert index.block_size == 32 and index.cached_tokens(long_prompt) == 64
        # The pool holds 3 blocks: the next prompt evicts, partial blocks among them; only
        # full blocks the index was told about are ever reported removed.
        told = set(stored[0].block_hashes)
        last = records[-1].event_id
        await _collect(engine.generate(_req("evict", prompt=tuple(range(100, 170)), max_tokens=2)))
        later = await _kv_records(engine, last)
        removed = [
            h for r in later if isinstance(r.event, BlockRemoved) for h in r.event.block_hashes
        ]
        assert removed and set(removed) <= told
    finally:
        await engine.stop()


async def test_attention_dp_rank_is_carried(model_dir: Path) -> None:
    """Real: with attention DP each rank has its own cache and every event carries
    `attention_dp_rank` (KVCacheEventSerializer, _utils.py); the DeepSeek decode config turns
    attention DP on. The adapter once reported rank 0 for all."""
    engine = await _engine(
        model_dir, enable_kv_events=True, enable_attention_dp=True, tensor_parallel_size=2
    )
    try:
        for i in range(2):
            prompt = tuple(range(200 + 40 * i, 240 + 40 * i))
            await _collect(engine.generate(_req(f"r{i}", prompt=prompt, max_tokens=2)))
        await asyncio.sleep(0.3)
        records, _ = engine.kv_event_log.since(-1)
        ranks = {r.event.dp_rank for r in records if isinstance(r.event, BlockStored)}
        assert ranks == {0, 1}
        # Dynamo's reader gets each rank in its batch (the default --kv-events-format).
        for rec in records[-2:]:
            assert decode_batch(dynamo_payload(rec)).data_parallel_rank == rec.event.dp_rank
    finally:
        await engine.stop()


# -- 6. LoRA adapters, served by name -----------------------------------------------------------
def _adapter(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text('{"r": 8, "target_modules": ["q_proj"]}')
    (path / "adapter_model.safetensors").write_bytes(b"stand-in weights")
    return path


async def test_lora_adapter_is_used_when_named(model_dir: Path, tmp_path: Path) -> None:
    """Real: generate_async(lora_request=LoRARequest(name, int_id, path)) (executor/request.py:
    the path must exist); the PyTorch backend loads it only with lora_config set, else ignores
    it (executor/base_worker.py). Before: lora_config could be set but no request named one."""
    sql = _adapter(tmp_path, "sql")
    engine = await _engine(model_dir, lora_modules=[f"sql={sql}"])
    try:
        assert engine.info.lora_names == ("sql",)
        assert engine._llm.args.lora_config.lora_dir == [str(sql)]
        base = _ids(await _collect(engine.generate(_req("b", max_tokens=8, ignore_eos=True))))
        req = GenerateRequest(
            "l", (5, 6, 7), SamplingParams(max_tokens=8, ignore_eos=True), lora_name="sql"
        )
        tuned = _ids(await _collect(engine.generate(req)))
        sent = engine._llm.recorded_requests[-1]["lora_request"]
        assert (sent.lora_name, sent.lora_int_id, sent.lora_path) == ("sql", 1, str(sql))
        assert tuned != base
        with pytest.raises(InvalidRequestError, match="no LoRA adapter"):
            await _collect(engine.generate(replace(req, request_id="x", lora_name="nope")))
    finally:
        await engine.stop()


def test_lora_modules_need_trtllm_aggregated(tmp_path: Path) -> None:
    for kw in ({"engine": "builtin"}, {"engine": "trtllm", "mode": "decode"}):
        with pytest.raises(ValueError, match="--lora-modules needs --engine trtllm"):
            Settings(lora_modules=[f"a={tmp_path}"], **kw)
    with pytest.raises(ValueError, match="NAME=PATH"):
        Settings(engine="trtllm", lora_modules=["just-a-path"])


async def test_requests_past_max_batch_size_wait_and_health_says_so(model_dir: Path) -> None:
    """Real: the capacity scheduler runs at most max_batch_size requests a step and queues the
    rest (iteration stats numActiveRequests / numQueuedRequests). Health counted every
    submitted request as running."""
    engine = await _engine(model_dir, max_batch_size=2)
    streams = [engine.generate(_req(f"r{i}", max_tokens=200, ignore_eos=True)) for i in range(5)]
    firsts = [asyncio.ensure_future(anext(s)) for s in streams]  # type: ignore[arg-type]
    try:
        await asyncio.wait(firsts, timeout=2)
        assert sum(f.done() for f in firsts) == 2  # only two got a slot
        health = engine.health()
        assert (health.running, health.waiting) == (2, 3)
    finally:
        for f in firsts:
            f.cancel()
        await asyncio.gather(*firsts, return_exceptions=True)
        for s in streams:
            await s.aclose()  # type: ignore[attr-defined]
        await engine.stop()


# -- a prompt id past the vocabulary -----------------------------------------------------------
async def test_a_prompt_id_past_the_vocabulary_is_a_400_not_the_end_of_the_engine(
    model_dir: Path,
) -> None:
    """Real (1.2 window): llmapi/llm.py generate_async passes prompt_token_ids to the GPU
    unchecked (_check_arguments checks only the length on the PyTorch backend); an id past the
    vocabulary is a device-side assert in the embedding, after which every request fails (the
    stand-in models it: executor/result.py _first_step). The HTTP edge checks a client's ids, but
    a sibling's context phase (routers/internal/disagg.py) reaches the engine with its own: the
    adapter refuses such a prompt before TensorRT-LLM sees it, and the request beside it runs."""
    engine = await _engine(model_dir)
    try:
        vocab = engine.info.vocab_size
        beside = asyncio.ensure_future(_collect(engine.generate(_req("b", max_tokens=8))))
        await asyncio.sleep(0)
        for bad in ((1, 2, vocab), (-1, 2)):
            with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
                await _collect(engine.generate(_req("x", prompt=bad)))
        events = await beside
        assert events[-1].finish_reason == "length" and len(_ids(events)) == 8
        assert engine.health().state == "ready"
        assert [r["prompt_token_ids"] for r in engine._llm.recorded_requests] == [[5, 6, 7]]
    finally:
        await engine.stop()


async def test_the_stand_in_ends_the_engine_on_such_an_id(model_dir: Path) -> None:
    """The stand-in's side of the test above: submitted to it directly, the id ends the request
    beside it and every later one, as a device-side assert would."""
    engine = await _engine(model_dir)
    try:
        llm = engine._llm
        sp = TrtSamplingParams(max_tokens=8)
        beside = llm.generate_async([5, 6, 7], sp, streaming=True)
        bad = llm.generate_async([1, engine.info.vocab_size], sp, streaming=True)
        with pytest.raises(Exception, match="device-side assert"):
            async for _ in bad:
                pass
        with pytest.raises(Exception, match="device-side assert"):
            async for _ in beside:
                pass
        with pytest.raises(RuntimeError, match="worker is gone"):
            llm.generate_async([5, 6, 7], sp, streaming=True)
    finally:
        await engine.stop()


# -- the AutoDeploy backend ------------------------------------------------------------------
async def test_autodeploy_starts_with_what_its_llm_args_take(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real (tensorrt_llm/_torch/auto_deploy/llm_args.py, 1.2 window): AutoDeploy's LlmArgs is
    AutoDeployConfig + BaseLlmArgs with extra="forbid", so TorchLlmArgs' enable_iter_perf_stats
    (always sent), cuda_graph_config and stream_interval failed its start; and its defaults are
    AutoDeployConfig's, a 512-token sequence and 8 requests, which the gateway reported as the
    model's 8,192 and TorchLlmArgs' 2,048 (the stand-in models both now)."""
    from tests.unit.test_trtllm_fidelity import _llama3_dir

    model = _llama3_dir(tmp_path)
    engine = await _engine(
        model, trtllm_backend="autodeploy", cuda_graph_batch_sizes=[4, 1, 2], stream_interval=2
    )
    try:
        warned = " ".join(r.getMessage() for r in caplog.records if "autodeploy" in r.getMessage())
        for name in ("enable_iter_perf_stats", "cuda_graph_config", "stream_interval"):
            assert f"`{name}`" in warned
        assert engine.info.max_model_len == 512 and engine.info.max_batch_size == 8
        assert engine._llm.args.max_seq_len == 512 and engine._llm.args.max_batch_size == 8
        with pytest.raises(InvalidRequestError, match="512"):
            await _collect(engine.generate(_req(prompt=tuple(range(100, 600)), max_tokens=16)))
        assert len(_ids(await _collect(engine.generate(_req(max_tokens=3))))) == 3
    finally:
        await engine.stop()
    given = await _engine(model, trtllm_backend="autodeploy", max_model_len=2048, max_batch_size=32)
    try:
        assert given.info.max_model_len == 2048 and given.info.max_batch_size == 32
        assert given._llm.args.max_seq_len == 2048
    finally:
        await given.stop()
