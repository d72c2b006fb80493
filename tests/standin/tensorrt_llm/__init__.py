"""Stand-in for `tensorrt_llm` 1.2 (no GPU): the documented LLM API surface the gateway uses.

Reproduces, from shared/reference/trtllm_api.md (section numbers there):
- §1.1 import paths: `tensorrt_llm.LLM`, `.SamplingParams`, `.MultimodalEncoder`,
  `.DisaggregatedParams`; `tensorrt_llm.llmapi` re-exports (KvCacheConfig, SchedulerConfig,
  CapacitySchedulerPolicy, DynamicBatchConfig, CudaGraphConfig, CacheTransceiverConfig,
  RequestError, ...); `tensorrt_llm.executor.utils.RequestError`;
  `tensorrt_llm._torch.auto_deploy.LLM`.
- §1.2 `LLM(model, tokenizer=None, ..., **kwargs)`: unknown kwargs raise
  `ValueError("LLM got invalid argument: ...")`; `backend` is popped; nested configs accepted as
  objects or dicts and validated strictly (unknown keys raise); `DynamicBatchConfig` has no
  defaults (all three fields required); `llm.args`, `llm.tokenizer`, `llm.shutdown()`.
- §2.1 `generate_async` is a plain method taking keyword arguments; raises
  `RuntimeError("LLM is shutting down")` after shutdown; without chunked prefill a prompt longer
  than max_num_tokens raises ValueError; `end_id` is filled when None (from the model's
  config.json here, as there is no tokenizer); context-only forces `max_tokens = 1` **on the
  SamplingParams object passed in** (mutation reproduced); the default `max_tokens` is 32.
- §2.3 `RequestOutput`: `request_id` is an **int** assigned by the engine; `outputs[0]` is a
  `CompletionOutput` with `token_ids`, `logprobs` (`list[dict[int, Logprob]]`, or the legacy flat
  `list[float]` when `FLAT_LOGPROBS` is set), `prompt_logprobs`, `finish_reason`, `stop_reason`,
  `disaggregated_params` and the `*_diff` properties; `cached_tokens`; `abort()`/`aborted()`;
  `await res` and `async for`.
- §2.4 streaming: `__anext__` returns **the same object mutated in place**; diffs are relative to
  the previous step; `detokenize=False` leaves `text == ""`; the end id is not part of
  `token_ids` (finish 'stop', stop_reason = end id), nor is a stop token id; 'length' at
  max_tokens; after `abort()` the next step ends with finish_reason 'cancelled'; iterating a
  result created without a running event loop fails with the documented assertion; per-request
  failures raise `RequestError` from the iteration (trigger here: a prompt token id outside the
  vocabulary, or a generation-only request whose opaque state does not match its prompt).
- §4.1 disaggregation: context-only returns one token, finish 'not_finished' (or 'stop' on the
  end id) and `DisaggregatedParams(context_only, first_gen_tokens, ctx_request_id: int,
  opaque_state: bytes)`; generation-only needs the **same prompt token ids** (checked against
  the opaque state) and starts its output with `first_gen_tokens`; both sides need
  `cache_transceiver_config`.
- §6 stats: `get_stats_async(timeout)` / `get_kv_cache_events_async(timeout)` return one shared
  async iterator per LLM that ends after `timeout` without data and is re-armed by the next
  request; empty before the first request (KV events assert instead); stats need
  `enable_iter_perf_stats`, KV events need `kv_cache_config.event_buffer_max_size > 0`; field
  names as in §6.2/§6.3.
- §7 `MultimodalEncoder(model, ...)`: `generate_async(inputs)` returns a result whose
  `mm_embedding_handle` has `tensor_size` and whose disaggregated params carry
  `multimodal_embedding_handles` and 8-int `multimodal_hashes`.

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
