"""Issue 35: what kills TensorRT-LLM 1.2's executor worker, modelled by the stand-in, and the
adapter keeping every such case away from it (at start-up, or as one request's 400).

Upstream, read from NVIDIA/TensorRT-LLM of the 1.2 window:
- tensorrt_llm/executor/base_worker.py `BaseWorker._enqueue_request`: `_load_lora_adapter`, the
  "kv_cache_transceiver is disabled" assert and the overlap-scheduler ValueError all run before
  its `try` (whose exceptions become RequestError);
- tensorrt_llm/executor/worker.py `worker_main`: catches only RequestError; anything else ends
  the worker and the proxy raises Exception("Failed during generation: ...");
- tensorrt_llm/inputs/registry.py: the base `attach_multimodal_embeddings` raises
  NotImplementedError; in 1.2 only LlavaNext's takes tensors;
- tensorrt_llm/_utils.py `KVCacheEventSerializer`: no lora_id in stored blocks (a TODO).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.configs import gateway, trtllm_engine
from tests.engine.tiny_llava import build_tiny_llava
from tests.standin import ensure_on_path
from tests.unit.test_trtllm_engine import _collect, _engine, _req, model_dir
from tests.unit.test_trtllm_vision import _prompt
from trtllm_gateway.config.engine_args import EngineArgsError
from trtllm_gateway.engine.disagg.embed_tensors import embeds_frame
from trtllm_gateway.engine.disagg.embed_wire import decode_frames
from trtllm_gateway.engine.kv_events.log import BlockStored
from trtllm_gateway.engine.protocol import (
    EngineDeadError,
    GenerateRequest,
    ImageInput,
    InvalidRequestError,
    SamplingParams,
)

ensure_on_path()

from tensorrt_llm import LLM, DisaggregatedParams  # noqa: E402
from tensorrt_llm import SamplingParams as TrtSamplingParams  # noqa: E402
from tensorrt_llm.llmapi import CacheTransceiverConfig, LoRARequest  # noqa: E402

from trtllm_gateway.engine.trtllm.loader import TrtllmUnsupportedError, preflight  # noqa: E402

__all__ = ["model_dir"]  # the fixture, shared with test_trtllm_engine
LAYOUT = "trtllm:llava:hidden=64"


def _context_only() -> Any:
    return DisaggregatedParams(request_type="context_only")


async def _drain(result: Any) -> None:
    with contextlib.suppress(Exception):
        await result


# -- the stand-in dies as 1.2's worker does ----------------------------------------------------
async def test_standin_worker_dies_on_a_context_only_request_with_overlap_on(
    model_dir: Path,
) -> None:
    """Real: base_worker.py raises ValueError("Context only requests are not supported ...")
    before its try; worker_main ends; the proxy raises "Failed during generation"; requests in
    flight never finish and the next submit gets no answer (the stand-in raises there)."""
    llm = LLM(model_dir, cache_transceiver_config=CacheTransceiverConfig(backend="DEFAULT"))
    try:
        running = llm.generate_async([5, 6, 7], TrtSamplingParams(max_tokens=50))
        with pytest.raises(Exception, match="Failed during generation: Context only") as info:
            llm.generate_async([5, 6, 7], TrtSamplingParams(), disaggregated_params=_context_only())
        assert type(info.value) is Exception  # not a ValueError: nothing says "bad request"
        with pytest.raises(Exception, match="executor worker is gone"):
            llm.generate_async([5, 6, 7], TrtSamplingParams())
        with pytest.raises(TimeoutError):  # no further response, ever
            async with asyncio.timeout(0.5):
                await running
    finally:
        llm.shutdown()


def test_standin_worker_asserts_on_a_disaggregated_request_without_transceiver(
    model_dir: Path,
) -> None:
    llm = LLM(model_dir)
    with pytest.raises(Exception, match="Failed during generation: kv_cache_transceiver is"):
        llm.generate_async([5, 6, 7], TrtSamplingParams(), disaggregated_params=_context_only())
    assert llm._executor.worker_died
    llm.shutdown()


def test_standin_worker_dies_loading_a_broken_lora_adapter(model_dir: Path, tmp_path: Path) -> None:
    """Real: `_load_lora_adapter` (LoraManager.load_from_ckpt) runs before the try."""
    broken = tmp_path / "broken"
    broken.mkdir()
    llm = LLM(model_dir, lora_config={"lora_dir": [str(broken)]})
    with pytest.raises(Exception, match=r"Failed during generation: .*adapter_config.json"):
        llm.generate_async(
            [5, 6, 7], TrtSamplingParams(), lora_request=LoRARequest("b", 1, str(broken))
        )
    assert llm._executor.worker_died
    llm.shutdown()


# -- item 1: prefill mode forces disable_overlap_scheduler --------------------------------------
async def test_prefill_mode_forces_disable_overlap_scheduler(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A --mode prefill instance without the flag or a YAML saying so: before, the first
    context-only request ended TensorRT-LLM's worker and the engine was dead."""
    caplog.set_level(logging.INFO, logger="trtllm_gateway.engine.trtllm.engine")
    prefill = await _engine(model_dir, mode="prefill")
    try:
        assert prefill._llm.args.disable_overlap_scheduler is True
        for i in range(2):
            result = await prefill.prefill(_req(f"p{i}", max_tokens=4))
            assert len(result.first_token_ids) == 1
        assert prefill.health().state == "ready"
        assert "disable_overlap_scheduler is forced true" in caplog.text
    finally:
        await prefill.stop()


def test_prefill_mode_refuses_a_yaml_that_turns_overlap_back_on(
    model_dir: Path, tmp_path: Path
) -> None:
    extra = tmp_path / "prefill.yaml"
    extra.write_text("disable_overlap_scheduler: false\n")
    with pytest.raises(
        EngineArgsError, match=r"prefill.yaml: disable_overlap_scheduler: .*prefill"
    ):
        trtllm_engine(model=str(model_dir), mode="prefill", extra_engine_args=extra)


def test_decode_mode_refuses_a_null_cache_transceiver_config(
    model_dir: Path, tmp_path: Path
) -> None:
    """Item 4: `cache_transceiver_config: null` passed TorchLlmArgs, then the first
    generation-only request hit the worker's assert and ended it."""
    extra = tmp_path / "decode.yaml"
    extra.write_text("cache_transceiver_config: null\n")
    for mode in ("decode", "prefill"):
        with pytest.raises(
            EngineArgsError, match=rf"decode.yaml: cache_transceiver_config: .*{mode}"
        ):
            trtllm_engine(model=str(model_dir), mode=mode, extra_engine_args=extra)


# -- item 2: one request's error is that request's ---------------------------------------------
@pytest.fixture(scope="module")
def plain_llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LLaVA 1.5 (model_type "llava"): its 1.2 input processor takes no embeddings."""
    return build_tiny_llava(tmp_path_factory.mktemp("llava"), "llava")


def _embeds_request(model: Path) -> GenerateRequest:
    (frame,) = decode_frames(embeds_frame("img", torch.zeros(4, 64), LAYOUT), "embeds")
    sp = SamplingParams(max_tokens=4, temperature=0.0)
    return GenerateRequest("e", _prompt(model), sp, (ImageInput("e", frame),))


async def test_image_embeds_for_a_model_that_cannot_take_them_are_a_400(
    plain_llava: Path,
) -> None:
    """Before: attach_multimodal_embeddings' NotImplementedError (not a ValueError) marked the
    whole engine dead; now a 400 before anything is submitted, and the engine serves on."""
    engine = trtllm_engine(model=str(plain_llava))
    await engine.start()
    try:
        with pytest.raises(InvalidRequestError, match=r"\(llava\) takes no image_embeds"):
            await _collect(engine.generate(_embeds_request(plain_llava)))
        assert engine.health().state == "ready"
        assert len(await _collect(engine.generate(_req("ok", max_tokens=2)))) == 2
    finally:
        await engine.stop()


async def test_the_input_processors_refusal_fails_only_its_request(
    plain_llava: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the up-front check, 1.2's NotImplementedError (raised in-process, outside the
    executor) still fails only its request: errors are classified by where they come from."""
    from trtllm_gateway.engine.trtllm import multimodal

    monkeypatch.setattr(multimodal, "takes_embeddings", lambda layout: True)
    engine = trtllm_engine(model=str(plain_llava))
    await engine.start()
    try:
        with pytest.raises(Exception, match="does not support multimodal embedding") as info:
            await _collect(engine.generate(_embeds_request(plain_llava)))
        assert not isinstance(info.value, EngineDeadError)
        assert engine.health().state == "ready"
    finally:
        await engine.stop()


def test_encode_url_is_refused_for_a_model_that_takes_no_embeddings(plain_llava: Path) -> None:
    config = gateway(engine="trtllm", model=str(plain_llava), encode_url=["http://e"])
    with pytest.raises(TrtllmUnsupportedError, match="only for llava_next models, not llava"):
        preflight(config.engine, config.trtllm, SimpleNamespace())  # type: ignore[arg-type]
    with pytest.raises(TrtllmUnsupportedError, match="not llava"):
        trtllm_engine(model=str(plain_llava), encode_url=["http://e"])


# -- item 3: LoRA adapters are checked at start-up ---------------------------------------------
def _adapter(root: Path, name: str, rank: int = 8, weights: bool = True) -> Path:
    path = root / name
    path.mkdir()
    (path / "adapter_config.json").write_text(f'{{"r": {rank}, "target_modules": ["q_proj"]}}')
    if weights:
        (path / "adapter_model.safetensors").write_bytes(b"stand-in weights")
    return path


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda root: root / "missing", "not a directory"),
        (lambda root: (root / "empty").mkdir() or root / "empty", "cannot read adapter_config"),
        (lambda root: _adapter(root, "big", rank=128), "rank 128 exceeds .*max_lora_rank 64"),
        (lambda root: _adapter(root, "noweights", weights=False), "no adapter_model"),
    ],
    ids=["missing", "no-config", "rank", "no-weights"],
)
def test_a_lora_adapter_the_worker_could_not_load_stops_the_start(
    model_dir: Path, tmp_path: Path, make: Any, reason: str
) -> None:
    """Before: the server started, and the first request naming the adapter ended the worker."""
    path = make(tmp_path)
    config = gateway(engine="trtllm", model=str(model_dir), lora_modules=[f"a={path}"])
    with pytest.raises(EngineArgsError, match=rf"--lora-modules a=.*: {reason}"):
        preflight(config.engine, config.trtllm, None)
    with pytest.raises(EngineArgsError, match=reason):
        trtllm_engine(model=str(model_dir), lora_modules=[f"a={path}"])


def test_max_lora_rank_from_the_yaml_admits_a_larger_adapter(
    model_dir: Path, tmp_path: Path
) -> None:
    path = _adapter(tmp_path, "big", rank=128)
    extra = tmp_path / "lora.yaml"
    extra.write_text("lora_config: {max_lora_rank: 128}\n")
    engine = trtllm_engine(
        model=str(model_dir), lora_modules=[f"a={path}"], extra_engine_args=extra
    )
    assert engine.info.lora_names == ("a",)


async def test_an_adapter_broken_after_start_kills_the_engine_as_the_worker_dies(
    model_dir: Path, tmp_path: Path
) -> None:
    """What start-up checks prevent: the stand-in's worker dies and the engine says so (503)."""
    path = _adapter(tmp_path, "a")
    engine = await _engine(model_dir, lora_modules=[f"a={path}"])
    try:
        (path / "adapter_config.json").unlink()
        req = GenerateRequest("l", (5, 6, 7), SamplingParams(max_tokens=4), lora_name="a")
        with pytest.raises(EngineDeadError, match="Failed during generation"):
            await _collect(engine.generate(req))
        assert engine.health().state == "dead"
    finally:
        await engine.stop()


# -- item 5: KV events carry no lora_id in 1.2 -------------------------------------------------
async def test_adapter_blocks_hash_apart_but_carry_no_lora_id(
    model_dir: Path, tmp_path: Path
) -> None:
    """Real: the C++ BlockKey holds the LoRA task id, so an adapter's blocks hash apart from
    the base model's, yet 1.2's serializer emits no lora_id: a router keying blocks by tokens
    conflates them (docs/trtllm.md says so)."""
    path = _adapter(tmp_path, "a")
    engine = await _engine(model_dir, enable_kv_events=True, lora_modules=[f"a={path}"])
    try:
        prompt = tuple(range(100, 180))
        await _collect(engine.generate(_req("base", prompt=prompt, max_tokens=2)))
        req = GenerateRequest("l", prompt, SamplingParams(max_tokens=2), lora_name="a")
        await _collect(engine.generate(req))
        await asyncio.sleep(0.3)
        records, _ = engine.kv_event_log.since(-1)
        stored = [r.event for r in records if isinstance(r.event, BlockStored)]
        assert len(stored) == 2
        base, tuned = stored
        assert base.token_ids == tuned.token_ids
        assert set(base.block_hashes).isdisjoint(tuned.block_hashes)
        assert base.lora_id is None and tuned.lora_id is None
    finally:
        await engine.stop()


# -- the refusals are one line at `serve`'s start ----------------------------------------------
@pytest.mark.parametrize(
    ("yaml_text", "flags", "reason"),
    [
        ("disable_overlap_scheduler: false\n", ["--mode", "prefill"], "disable_overlap_scheduler"),
        ("cache_transceiver_config: null\n", ["--mode", "decode"], "cache_transceiver_config"),
        ("scheduler_config: {waiting_queue_policy: fcfs}\n", [], "gained it in 1.3"),
        ("{}\n", ["--lora-modules", "a=/nonexistent/adapter"], "--lora-modules a="),
    ],
    ids=["prefill-overlap", "decode-no-transceiver", "waiting-queue-policy", "lora"],
)
def test_serve_stops_with_one_line(
    model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    yaml_text: str,
    flags: list[str],
    reason: str,
) -> None:
    """As a user meets them: `trtllm-gateway serve` exits 1 before the server starts, with one
    line naming the file or flag, the key and why (no traceback)."""
    from trtllm_gateway.app.cli import main

    monkeypatch.setattr("trtllm_gateway.web.logs.configure_logging", lambda *_a, **_k: None)
    extra = tmp_path / "engine.yaml"
    extra.write_text(yaml_text)
    argv = ["serve", "--engine", "trtllm", "--model", str(model_dir), "--extra-engine-args"]
    assert main([*argv, str(extra), *flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert reason in err[0]
    assert "Traceback" not in err[0]
