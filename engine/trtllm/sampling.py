"""Our SamplingParams -> a fresh `tensorrt_llm.SamplingParams` per request (detokenize=False).

Both engines detokenize and match stop strings in engine/tokenizer.py, so TensorRT-LLM is asked
for token ids only; `end_id` is always set (no dependence on TensorRT-LLM's tokenizer).
"""

from __future__ import annotations

from typing import Any

from engine.protocol import SamplingParams


def to_trtllm_sampling(
    trt: Any, sp: SamplingParams, *, end_id: int, max_tokens: int | None = None
) -> Any:
    """Build `tensorrt_llm.SamplingParams`; max_tokens overrides sp.max_tokens (prefill: 1).

    A new object every call: TensorRT-LLM mutates it (context-only max_tokens, end_id).
    """
    return trt.SamplingParams(
        max_tokens=sp.max_tokens if max_tokens is None else max_tokens,
        end_id=end_id,
        pad_id=end_id,
        n=1,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k if sp.top_k > 0 else None,
        min_p=sp.min_p if sp.min_p > 0 else None,
        presence_penalty=sp.presence_penalty or None,
        frequency_penalty=sp.frequency_penalty or None,
        repetition_penalty=sp.repetition_penalty if sp.repetition_penalty != 1.0 else None,
        seed=sp.seed,
        min_tokens=sp.min_tokens or None,
        ignore_eos=sp.ignore_eos,
        stop_token_ids=list(sp.stop_token_ids) or None,
        logprobs=sp.logprobs,
        prompt_logprobs=sp.prompt_logprobs,
        detokenize=False,
    )
