"""Stand-in `tensorrt_llm.llmapi.llm.LLM` (PyTorch backend surface, §1.2, §2.1, §6)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tensorrt_llm import _logits_hook, _scripted
from tensorrt_llm._guided import GuidedDecoder
from tensorrt_llm._kv_cache import BlockPool
from tensorrt_llm.disaggregated_params import DisaggregatedParams
from tensorrt_llm.executor.base_worker import GenerationRequest
from tensorrt_llm.executor.proxy import GenerationExecutorProxy
from tensorrt_llm.executor.result import IterationResult, RequestOutput
from tensorrt_llm.inputs.registry import InputProcessor, create_input_processor
from tensorrt_llm.llmapi.llm_args import (
    NESTED_MODELS,
    TORCH_LLM_ARGS,
    KvCacheConfig,
    TorchLlmArgs,
)
from tensorrt_llm.sampling_params import SamplingParams

logger = logging.getLogger("tensorrt_llm")

_DEFAULTS: dict[str, Any] = {
    "max_batch_size": 2048,
    "max_num_tokens": 8192,
    "max_seq_len": None,
    "max_beam_width": 1,
    "enable_chunked_prefill": False,
    "enable_iter_perf_stats": False,
    "cache_transceiver_config": None,
    "max_stats_len": 1000,
    "guided_decoding_backend": None,
    "lora_config": None,
    "disable_overlap_scheduler": False,  # TorchLlmArgs: the overlap scheduler is on by default
}


class LLM:
    def __init__(
        self,
        model: str | Path,
        tokenizer: Any = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("backend", None)
        kwargs.pop("_mpi_session", None)
        invalid = sorted(k for k in kwargs if k not in TORCH_LLM_ARGS)
        if invalid:
            raise ValueError(f"LLM got invalid argument: {', '.join(invalid)}")
        TorchLlmArgs.model_validate(kwargs)  # nested configs: unknown keys raise
        args = {**_DEFAULTS, **kwargs}
        for name, model_cls in NESTED_MODELS.items():
            value = args.get(name)
            if isinstance(value, dict):
                args[name] = model_cls.model_validate(value)
        if args.get("kv_cache_config") is None:
            args["kv_cache_config"] = KvCacheConfig()
        self.args = SimpleNamespace(
            model=str(model),
            tokenizer=tokenizer,
            trust_remote_code=trust_remote_code,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            **args,
        )
        self.tokenizer = None  # the stand-in never loads one; callers pass token ids
        self.llm_id = f"standin-{os.getpid()}"
        config = _read_config(Path(model))
        self._vocab_size = int(config.get("vocab_size") or 32000)
        self._hidden = int(config.get("hidden_size") or 64)
        self._input_processor = create_input_processor(
            config.get("model_type"), self._vocab_size, self._hidden
        )
        # tokenizer.eos_token_id fills a missing end_id (one id); the model itself ends a turn
        # with the last id of generation_config.json's eos list (Llama-3.x: <|eot_id|> 128009),
        # which TensorRT-LLM only stops on if it is end_id or in stop_token_ids.
        eos = config.get("eos_token_id")
        self._eos = eos[0] if isinstance(eos, list) else eos
        turn_end = _read_json(Path(model) / "generation_config.json").get("eos_token_id", eos)
        self._turn_end = turn_end[-1] if isinstance(turn_end, list) else turn_end
        self._next_request_id = 1
        self._active: dict[int, RequestOutput] = {}
        self._seen_blocks: set[tuple[int | None, ...]] = set()
        self._any_request = False
        self._shutdown = False
        self._iteration = 0
        self._stats = IterationResult()
        self._kv_events = IterationResult()
        kv = self.args.kv_cache_config
        attention_dp = bool(getattr(self.args, "enable_attention_dp", False))
        self._pool = BlockPool(
            self._kv_events.put,
            tokens_per_block=kv.tokens_per_block,
            capacity=kv.max_tokens // kv.tokens_per_block if kv.max_tokens else 4096,
            dp_size=self.args.tensor_parallel_size if attention_dp else 1,
            attention_dp=attention_dp,
        )
        # Lifetime counters, as the C++ KV cache manager keeps them: every iteration's
        # kvCacheStats repeats the running totals (kvCacheManager getKvCacheStats), not deltas.
        self._reused_blocks = 0
        self._missed_blocks = 0
        backend = self.args.guided_decoding_backend
        self._guided = GuidedDecoder(Path(model), backend, self._vocab_size) if backend else None
        self.recorded_requests: list[dict[str, Any]] = []  # stand-in only: what was submitted
        # The executor: a proxy in front of one worker process (executor/proxy.py, worker.py).
        self._executor = GenerationExecutorProxy(self.args)
        logger.info("stand-in LLM ready: %s", model)

    # -- requests ---------------------------------------------------------------------------
    def generate_async(
        self,
        inputs: Any,
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: DisaggregatedParams | None = None,
        trace_headers: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: str | None = None,
    ) -> RequestOutput:
        if self._shutdown:
            raise RuntimeError("LLM is shutting down")
        prompt_token_ids = _prompt_token_ids(
            inputs, self._vocab_size, self._hidden, self._input_processor
        )
        sp = sampling_params if sampling_params is not None else SamplingParams()
        if sp.end_id is None:
            if self._eos is None:
                raise ValueError("end_id is None and there is no tokenizer to take it from")
            sp.end_id = self._eos
        _check_embedding_bias(sp.embedding_bias, self._vocab_size)
        if sp.guided_decoding is not None and self.args.guided_decoding_backend is None:
            # No guided decoder was built (py_executor_creator): the guide is ignored.
            logger.warning("guided_decoding given but no guided_decoding_backend: ignored")
        request_type = disaggregated_params.request_type if disaggregated_params else None
        if request_type == "context_only":
            sp.max_tokens = 1  # mutates the caller's object, as TensorRT-LLM does
        if (
            not self.args.enable_chunked_prefill
            and request_type != "generation_only"
            and len(prompt_token_ids) > self.args.max_num_tokens
        ):
            raise ValueError(
                f"prompt length {len(prompt_token_ids)} exceeds max_num_tokens "
                f"{self.args.max_num_tokens} and chunked prefill is off"
            )
        request_id = self._next_request_id
        self._next_request_id += 1
        self.recorded_requests.append(
            {
                "request_id": request_id,
                "prompt_token_ids": list(prompt_token_ids),
                "sampling_params": sp,
                "streaming": streaming,
                "disaggregated_params": disaggregated_params,
                "inputs": inputs,
                "lora_request": lora_request,
                "trace_headers": trace_headers,
            }
        )
        # The worker's intake (executor/base_worker.py): what it raises before its `try` ends
        # the worker (executor/worker.py) and every request in flight with it.
        try:
            self._executor.submit(
                GenerationRequest(request_id, list(prompt_token_ids), lora_request, request_type)
            )
        except Exception:
            # A dead worker answers nothing more: the requests in flight wait for ever
            # (executor/result.py _wait_for_a_slot models it; executor/proxy.py says why).
            raise
        if lora_request is not None and self.args.lora_config is None:
            # Real (executor/base_worker.py): the PyTorch backend builds a LoRA manager only
            # with lora_config; without one every lora_request is silently ignored.
            lora_request = None
        res = RequestOutput(
            self, request_id, prompt_token_ids, sp, streaming, disaggregated_params, lora_request
        )
        res.logits_post_processors = _logits_hook.to_worker(sp.logits_processor)
        self._active[request_id] = res
        self._any_request = True
        self._stats.mark_undone()
        self._kv_events.mark_undone()
        return res

    def shutdown(self) -> None:
        if self._shutdown:  # real: LLM.shutdown() returns once its executor is gone
            return
        for res in list(self._active.values()):
            res.abort()
        self._shutdown = True

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- stats and KV events ------------------------------------------------------------------
    def get_stats_async(self, timeout: float = 2) -> Any:
        if not self._any_request:
            logger.warning("get_stats_async: no request has been sent yet")
            return []
        self._stats.timeout = timeout
        return self._stats

    def get_kv_cache_events_async(self, timeout: float = 2) -> IterationResult:
        assert self._any_request, "KV cache events are only available after the first request"
        self._kv_events.timeout = timeout
        return self._kv_events

    # -- called by RequestOutput ----------------------------------------------------------
    def _reuse_prefix(
        self, request_id: int, prompt_token_ids: list[int], lora_task_id: int | None = None
    ) -> int:
        # As WindowBlockManager::addSequence / loadOrAllocateBlocks (batch_manager/
        # kvCacheManager.cpp): block keys cover the prompt less its last token ("it can't be
        # recovered"), so at least one token is always recomputed; each of the
        # ceil(len / tokens_per_block) context blocks counts once, as reused (++mReusedBlocks)
        # or missed (++mMissedBlocks). Partial-block reuse is not modelled: only full blocks match.
        # BlockKey holds the request's LoRA task id: an adapter's blocks never match the base
        # model's, and their hashes differ, though the events carry no lora_id (_kv_cache.py).
        kv = self.args.kv_cache_config
        size = kv.tokens_per_block
        keyed = len(prompt_token_ids) - 1
        blocks = [
            (lora_task_id, *prompt_token_ids[: i + size]) for i in range(0, keyed - size + 1, size)
        ]
        if not kv.enable_block_reuse:
            return 0
        reused = 0
        for block in blocks:
            if block not in self._seen_blocks:
                break
            reused += 1
        new = [b for b in blocks[reused:] if b not in self._seen_blocks]
        self._reused_blocks += reused
        self._missed_blocks += -(-len(prompt_token_ids) // size) - reused
        self._seen_blocks.update(new)
        if kv.event_buffer_max_size > 0:
            self._pool.store(
                prompt_token_ids[:keyed], self._pool.rank_for(request_id), lora_task_id
            )
        return reused * size

    def _on_step(self, res: RequestOutput) -> None:
        self._iteration += 1
        if not self.args.enable_iter_perf_stats:
            return
        kv = self.args.kv_cache_config
        used = sum(
            (len(r.prompt_token_ids) + len(r.outputs[0].token_ids)) // kv.tokens_per_block + 1
            for r in self._active.values()
        )
        # KVCacheManager sizes the pool from max_tokens when given (in tokens_per_block blocks).
        max_blocks = kv.max_tokens // kv.tokens_per_block if kv.max_tokens else 4096
        self._stats.put(
            {
                "iter": self._iteration,
                "iterLatencyMS": 1.0,
                "numActiveRequests": min(len(self._active), self.args.max_batch_size),
                "numQueuedRequests": max(0, len(self._active) - self.args.max_batch_size),
                "numCompletedRequests": 0,
                "maxNumActiveRequests": self.args.max_batch_size,
                "kvCacheStats": {
                    "maxNumBlocks": max_blocks,
                    "freeNumBlocks": max_blocks - used,
                    "usedNumBlocks": used,
                    "tokensPerBlock": kv.tokens_per_block,
                    "allocTotalBlocks": used,
                    "allocNewBlocks": 0,
                    "reusedBlocks": self._reused_blocks,
                    "missedBlocks": self._missed_blocks,
                    "cacheHitRate": 0.0,
                },
                "inflightBatchingStats": {
                    "numScheduledRequests": len(self._active),
                    "numContextRequests": 0,
                    "numGenRequests": len(self._active),
                    "numPausedRequests": 0,
                    "numCtxTokens": 0,
                    "microBatchId": 0,
                    "avgNumDecodedTokensPerIter": 1.0,
                },
            }
        )

    def _scheduled(self, res: RequestOutput) -> bool:
        """Whether `res` is among the max_batch_size oldest unfinished requests (FCFS)."""
        for i, request_id in enumerate(self._active):
            if i >= self.args.max_batch_size:
                return False
            if request_id == res.request_id:
                return True
        return True

    def _on_finish(self, res: RequestOutput) -> None:
        self._active.pop(res.request_id, None)

    def _fail_all(self, message: str) -> None:
        """PyExecutor._handle_errors: a failed forward step fails every active request."""
        for res in self._active.values():
            res._failed = message


def _prompt_token_ids(inputs: Any, vocab: int, hidden: int, processor: InputProcessor) -> list[int]:
    if isinstance(inputs, str):
        raise ValueError("the stand-in has no tokenizer: pass prompt_token_ids")
    if isinstance(inputs, dict) and "prompt" in inputs and inputs.get("multi_modal_data"):
        return _multimodal_ids(inputs["prompt"], inputs["multi_modal_data"], vocab, hidden)
    if isinstance(inputs, dict) and "prompt" in inputs and "multi_modal_embeddings" in inputs:
        # llmapi/llm.py -> the model's input processor (inputs/registry.py)
        return processor.attach_multimodal_embeddings(
            inputs["prompt"], inputs["multi_modal_embeddings"]
        )
    if isinstance(inputs, list):
        return [int(t) for t in inputs]
    if isinstance(inputs, dict) and "prompt_token_ids" in inputs:
        return [int(t) for t in inputs["prompt_token_ids"]]
    raise TypeError(f"unsupported prompt inputs: {type(inputs).__name__}")


def image_pixels(image: Any) -> bytes:
    return image.tobytes() if hasattr(image, "tobytes") else repr(image).encode()


def _multimodal_ids(prompt: Any, data: Any, vocab: int, hidden: int) -> list[int]:
    """A TextPrompt with images (§2.2): no tokenizer here, so the text's UTF-8 bytes stand in
    for its tokens and each image adds one id from its embedding (the vision tower's output
    for its pixels), so an image and its precomputed embedding give the same tokens."""
    if not isinstance(prompt, str) or not isinstance(data, dict) or set(data) != {"image"}:
        raise TypeError("multimodal inputs need a str prompt and multi_modal_data={'image': [...]}")
    ids = [b % vocab for b in prompt.encode()]
    for image in data["image"]:
        embedding = _scripted.image_embedding(image_pixels(image), 4, hidden)
        ids.append(_scripted.embedding_token(embedding, vocab))
    return ids


def _check_embedding_bias(bias: Any, vocab: int) -> None:
    """The executor Request takes a float32 tensor of shape [vocab_size] (or [1, vocab_size])."""
    if bias is None:
        return
    import torch

    if not isinstance(bias, torch.Tensor) or bias.dtype != torch.float32:
        raise TypeError("embedding_bias must be a torch.float32 tensor")
    if bias.squeeze(0).shape != (vocab,):
        raise ValueError(f"embedding_bias must have shape [{vocab}], got {list(bias.shape)}")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _read_config(model: Path) -> dict[str, Any]:
    config = _read_json(model / "config.json")
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**text, **{k: v for k, v in config.items() if k != "text_config"}}
    return config
