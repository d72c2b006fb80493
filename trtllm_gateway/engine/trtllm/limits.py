"""What one request may ask of TensorRT-LLM: the context length and one step's prefill budget."""

from __future__ import annotations

from typing import Any

from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    EngineInfo,
    GenerateRequest,
    InvalidRequestError,
)

TRTLLM_MAX_NUM_TOKENS = 8192  # TorchLlmArgs' default when no layer sets max_num_tokens
TRTLLM_MAX_BATCH_SIZE = 2048  # likewise for max_batch_size


def check_request(req: GenerateRequest, info: EngineInfo, args: dict[str, Any]) -> None:
    """InvalidRequestError (400) for a request TensorRT-LLM would refuse or fail, or that
    would end it (a prompt id outside the vocabulary).

    Without chunked prefill the PyTorch backend cannot schedule a prompt longer than one
    step's token budget (max_num_tokens); say so, naming both, instead of TensorRT-LLM failing
    the request. A generation-only request's prompt was prefilled by the sibling.
    """
    if not req.prompt_token_ids:
        raise InvalidRequestError("the prompt is empty")
    vocab = info.vocab_size
    if vocab and not 0 <= min(req.prompt_token_ids) <= max(req.prompt_token_ids) < vocab:
        # TensorRT-LLM passes prompt ids to the GPU unchecked: one past the vocabulary is a
        # device-side assert in the embedding, which ends the engine for every request. The
        # HTTP edge checks a client's ids; this also covers a sibling's (routers/internal).
        raise InvalidRequestError(f"a prompt token id is outside the vocabulary [0, {vocab})")
    prompt, max_tokens = len(req.prompt_token_ids), req.sampling.max_tokens
    if prompt + max_tokens > info.max_model_len:
        raise ContextTooLongError(prompt, max_tokens, info.max_model_len)
    if req.disagg is not None and req.disagg.request_type == "generation_only":
        return
    budget = int(args.get("max_num_tokens") or TRTLLM_MAX_NUM_TOKENS)
    if not args.get("enable_chunked_prefill") and prompt > budget:
        raise InvalidRequestError(
            f"the prompt has {prompt} tokens, more than max_num_tokens ({budget}) that "
            "TensorRT-LLM prefills in one step without chunked prefill; shorten the prompt, "
            "or start the server with --enable-chunked-prefill or a larger --max-num-tokens"
        )
