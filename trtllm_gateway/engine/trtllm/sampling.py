"""Our SamplingParams -> a fresh `tensorrt_llm.SamplingParams` per request (detokenize=False).

Both engines detokenize and match stop strings in engine/tokenizer.py, so TensorRT-LLM is asked
for token ids only; `end_id` is always set (no dependence on TensorRT-LLM's tokenizer). What
1.2 takes, field by field (tensorrt_llm/sampling_params.py):

- end_id is one id: a model's other EOS ids (Llama-3.x: <|eom_id|>, <|eot_id|>) ride in
  `stop_token_ids`, after the user's own, or the turn never ends.
- logprobs / prompt_logprobs are tested for truth, so 0 means none. The period TorchSampler
  stores only the top k of log_softmax and never adds the sampled token
  (_torch/pyexecutor/sampler.py), so under sampling the chosen token is often missing: ask for
  the top max(k, 20) (OpenAI's most) and let engine.trtllm.outputs trim back to k; a token
  outside even that is unknown. Prompt logprobs: max(1, k), the actual token is never added.
- logit_bias and allowed_token_ids become one `embedding_bias` (float32 [vocab], added to the
  logits; the PyTorch sampler applies it every step); disallowed ids get -inf.
- guided decoding is `GuidedDecodingParams(json= | json_object= | regex= | grammar=)`; a Lark
  grammar only means Lark under `guided_decoding_backend: llguidance` (xgrammar reads EBNF).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtllm_gateway.engine.protocol import (
    GuidedDecoding,
    InvalidRequestError,
    SamplingParams,
    check_token_ids,
)

GUIDED_PARAM = "response_format"  # also reached through tool_choice and structured_outputs
# OpenAI's top_logprobs maximum: its chat docs give -9999.0 to a token outside the top 20.
TOP_LOGPROBS_ASKED = 20


def to_trtllm_sampling(
    trt: Any,
    sp: SamplingParams,
    *,
    end_id: int,
    hidden_stop_ids: Sequence[int] = (),
    max_tokens: int | None = None,
    vocab_size: int = 0,
    guided_backend: str | None = None,
) -> Any:
    """Build `tensorrt_llm.SamplingParams`; max_tokens overrides sp.max_tokens (prefill: 1).

    A new object every call: TensorRT-LLM mutates it (context-only max_tokens, end_id).
    Raises InvalidRequestError for what TensorRT-LLM cannot do as asked.
    """
    stops = list(sp.stop_token_ids)
    if not sp.ignore_eos:
        stops += [t for t in hidden_stop_ids if t != end_id and t not in stops]
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
        stop_token_ids=stops or None,
        logprobs=None if sp.logprobs is None else max(sp.logprobs, TOP_LOGPROBS_ASKED),
        prompt_logprobs=_at_least_one(sp.prompt_logprobs),
        embedding_bias=embedding_bias(sp, vocab_size),
        guided_decoding=guided_params(trt, sp.guided, guided_backend),
        detokenize=False,
    )


def _at_least_one(k: int | None) -> int | None:
    return None if k is None else max(1, k)


def embedding_bias(sp: SamplingParams, vocab_size: int) -> Any:
    """logit_bias and allowed_token_ids as one float32 [vocab_size] CPU tensor, or None."""
    if not sp.logit_bias and sp.allowed_token_ids is None:
        return None
    if vocab_size <= 0:
        raise InvalidRequestError(
            "logit_bias needs the model's vocabulary size, which is unknown", param="logit_bias"
        )
    # Its own door, as the built-in engine's (a caller past the HTTP routes' checks): an id past
    # the tensor is an IndexError here, not the request's 400.
    check_token_ids((t for t, _ in sp.logit_bias), vocab_size, "logit_bias")
    check_token_ids(sp.allowed_token_ids or (), vocab_size, "allowed_token_ids")
    import torch  # the gateway's own dependency; TensorRT-LLM wants a torch tensor here

    if sp.allowed_token_ids is not None:
        if not sp.allowed_token_ids:
            raise InvalidRequestError("allowed_token_ids is empty", param="allowed_token_ids")
        bias = torch.full((vocab_size,), float("-inf"), dtype=torch.float32)
        bias[list(sp.allowed_token_ids)] = 0.0
    else:
        bias = torch.zeros(vocab_size, dtype=torch.float32)
    for token_id, value in sp.logit_bias:
        bias[token_id] += float(value)
    return bias


def guided_params(trt: Any, guided: GuidedDecoding | None, backend: str | None) -> Any:
    """`GuidedDecodingParams` for one request, or None; InvalidRequestError naming what fails."""
    if guided is None:
        return None
    if backend is None:
        raise InvalidRequestError(
            f"structured output ({guided.kind}) needs the server started with "
            "--guided-decoding-backend xgrammar or llguidance",
            param=GUIDED_PARAM,
        )
    if guided.start_after:
        # 1.2's GuidedDecodingParams constrain from the first generated token; it has no
        # "after the reasoning ends" trigger, so a reasoning model would be forced into the
        # format before it thinks. Refuse rather than silently change the output.
        raise InvalidRequestError(
            "structured output after reasoning (a reasoning parser is on) is not supported "
            "by the TensorRT-LLM engine; turn reasoning off or use --engine builtin",
            param=GUIDED_PARAM,
        )
    params = trt.sampling_params.GuidedDecodingParams
    if guided.kind == "json":
        return params(json=guided.spec)
    if guided.kind == "json_object":
        return params(json_object=True)
    if guided.kind == "regex":
        return params(regex=guided.spec)
    if backend != "llguidance":
        raise InvalidRequestError(
            "a Lark grammar needs --guided-decoding-backend llguidance "
            f"(TensorRT-LLM's {backend} backend reads EBNF, not Lark)",
            param=GUIDED_PARAM,
        )
    return params(grammar=guided.spec)
