"""Stand-in for `tensorrt_llm` 1.2 (no GPU): the documented LLM API surface the gateway uses.

Reproduces, from TensorRT-LLM 1.2-era sources (NVIDIA/TensorRT-LLM; its paths named
below are under tensorrt_llm/ there, except those starting with cpp/):
- import paths (`__init__.py`, `llmapi/__init__.py`, `executor/utils.py`): `tensorrt_llm.LLM`,
  `.SamplingParams`, `.MultimodalEncoder`, `.DisaggregatedParams`; `tensorrt_llm.llmapi` re-exports
  (KvCacheConfig, SchedulerConfig, CapacitySchedulerPolicy, DynamicBatchConfig, CudaGraphConfig,
  CacheTransceiverConfig, RequestError, ...); `tensorrt_llm.executor.utils.RequestError`;
  `tensorrt_llm._torch.auto_deploy.LLM`.
- `llmapi/llm.py` + `llmapi/llm_args.py`: `LLM(model, tokenizer=None, ..., **kwargs)`: unknown
  kwargs raise `ValueError("LLM got invalid argument: ...")`; `backend` is popped; nested configs
  accepted as objects or dicts and validated strictly (unknown keys raise) against a
  `TorchLlmArgs` whose fields carry llm_args.py's types; batch_sizes with a max_batch_size
  that does not generate them is refused (validate_cuda_graph_config); `llm.args`,
  `llm.tokenizer`, `llm.shutdown()`.
- `llmapi/llm.py` `generate_async` is a plain method taking keyword arguments; raises
  `RuntimeError("LLM is shutting down")` after shutdown; without chunked prefill a prompt longer
  than max_num_tokens raises ValueError; `end_id` is filled when None (from the model's config.json
  here, as there is no tokenizer); context-only forces `max_tokens = 1` **on the SamplingParams
  object passed in** (mutation reproduced); the default `max_tokens` is 32.
- `executor/result.py` `RequestOutput`: `request_id` is an **int** assigned by the engine;
  `outputs[0]` is a `CompletionOutput` with `token_ids`, `logprobs` (`list[dict[int, Logprob]]`, or
  the legacy flat `list[float]` when `FLAT_LOGPROBS` is set), `prompt_logprobs`, `finish_reason`,
  `stop_reason`, `disaggregated_params` and the `*_diff` properties; `cached_tokens`;
  `abort()`/`aborted()`; `await res` and `async for`.
- `executor/result.py` streaming: `__anext__` returns **the same object mutated in place**; diffs
  are relative to the previous step; `detokenize=False` leaves `text == ""`; the end id is not part
  of `token_ids` (finish 'stop', stop_reason None), nor is a stop token id; 'length' at max_tokens;
  after `abort()` the next step ends with finish_reason 'cancelled'; iterating a result created
  without a running event loop fails with the documented assertion; per-request failures raise
  `RequestError` from the iteration (trigger here: a prompt token id outside the vocabulary, or a
  generation-only request whose opaque state does not match its prompt).
- `disaggregated_params.py` + `executor/result.py` disaggregation: context-only returns one token,
  finish 'not_finished' (or 'stop' on the end id) and `DisaggregatedParams(context_only,
  first_gen_tokens, ctx_request_id: int, opaque_state: bytes)`; generation-only needs the **same
  prompt token ids** (checked against the opaque state) and starts its output with
  `first_gen_tokens`; both sides need `cache_transceiver_config`.
- `llmapi/llm.py` stats: `get_stats_async(timeout)` / `get_kv_cache_events_async(timeout)` return
  one shared async iterator per LLM that ends after `timeout` without data and is re-armed by the
  next request; empty before the first request (KV events assert instead); stats need
  `enable_iter_perf_stats`, KV events need `kv_cache_config.event_buffer_max_size > 0`; field names
  as `_torch/pyexecutor/py_executor.py` and the executor's JSON serialization write them.
- `llmapi/mm_encoder.py` `MultimodalEncoder(model, ...)`: `generate_async(TextPrompt)` returns a
  result whose `mm_embedding_handle` has `tensor_size` and whose disaggregated params carry
  `multimodal_embedding_handles` and 8-int `multimodal_hashes`; `_torch/shared_tensor`'s
  `SharedTensorContainer` opens a handle in the same process only (CUDA IPC: same node).
- precomputed embeddings: `{"prompt": str, "multi_modal_embeddings": {"image": [tensor]}}`
  (image only, a text prompt, the text hidden size); an image and its embedding give the same
  tokens.

Less kind than a naive fake, as the real library is (tests/unit/test_trtllm_fidelity.py):
- the model ends its turn with the last EOS id of generation_config.json (Llama-3: <|eot_id|>),
  which stops generation only if it is `end_id` or in `stop_token_ids`;
- sampled logprobs are the top k of the raw distribution only (TorchSampler), the sampled
  token not added: under sampling it is often missing (`_scripted.sampled_rank`);
- every non-cancelled response asserts `len(logprobs) == len(token_ids)`, which a
  generation-only request (its first token handed over without a logprob) fails;
- KV events: stored runs may end in a partial block, eviction sends "removed", and with
  attention DP every event carries `attention_dp_rank` (`_kv_cache.py`);
- `LoRARequest` needs an existing path; without `lora_config` a lora_request is ignored;
- the executor worker dies as 1.2's does (`executor/base_worker.py`, `worker.py`, `proxy.py`):
  what `BaseWorker._enqueue_request` raises before its `try` (an adapter that cannot load:
  no `adapter_config.json`, no weights, rank over `max_lora_rank`; a disaggregated request
  without a transceiver; a context-only request with the overlap scheduler on) ends the worker,
  `generate_async` raises `Exception("Failed during generation: ...")`, the requests in flight
  fail and every later submit raises;
- precomputed embeddings only for `llava_next` (`inputs/registry.py`): any other model's input
  processor raises NotImplementedError;
- a LoRA request's KV blocks hash apart from the base model's, and no event carries `lora_id`;
- 1.2.0's `llm_args.py`: no `scheduler_config.waiting_queue_policy`, `DynamicBatchConfig`'s
  fields required, `kv_transfer_timeout_ms` > 0, `speculative_config` / `kv_connector_config` /
  `torch_compile_config` typed;
- `logprobs=0` / `prompt_logprobs=0` return nothing (tested for truth); prompt logprobs are one
  top-k dict per prompt position, entry t scoring token t+1, the actual token only sometimes
  among them (`_scripted.prompt_topk`);
- `kvCacheStats.reusedBlocks` / `missedBlocks` are lifetime totals in every iteration, each
  context block counted once, reused or missed; block keys stop before the prompt's last
  token, so cached_tokens < len(prompt) (cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp);
- `RequestOutput.abort()` raises after `llm.shutdown()`, finished or not (executor/result.py);
- `LLM(...)` validates its kwargs with `TorchLlmArgs` (1.2's keys: with
  `fail_fast_on_attention_window_too_large`, without `custom_tokenizer` / `model_kwargs` /
  `env_overrides`); `tensorrt_llm.logger.logger.set_level`;
- `SamplingParams.guided_decoding` (`GuidedDecodingParams`, one guide only) is ignored without
  `guided_decoding_backend`; with it, the scripted tokens are masked by llguidance built from
  the model's tokenizer (`_guided.py`); `embedding_bias` must be float32 [vocab] and steers
  the tokens.
- `SamplingParams.logits_processor` (one callable or a list) is pickled to the worker, checked
  to take 4 or 5 parameters and called each step as `lp(req_id, logits[1, 1, vocab],
  [prompt + output], None, None)` before embedding_bias and the guide; one that raises fails
  every active request (`_logits_hook.py`).

Tokens are not a model's: a hash of (prompt token ids, position) picks each one, so a run is
deterministic and the same prompt gives the same tokens aggregated or split prefill/decode. The
natural length (before the end id) is 16..63 tokens; `ignore_eos` and `min_tokens` are honoured.
Env `TRTLLM_STANDIN_STEP_DELAY_S` sleeps that long per step (for disconnect tests).
"""

from tensorrt_llm.disaggregated_params import DisaggregatedParams
from tensorrt_llm.llmapi.llm import LLM
from tensorrt_llm.llmapi.mm_encoder import MultimodalEncoder
from tensorrt_llm.sampling_params import SamplingParams

__version__ = "1.2.0+standin"
__all__ = ["LLM", "DisaggregatedParams", "MultimodalEncoder", "SamplingParams", "__version__"]
