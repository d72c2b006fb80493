"""The request fields chat and completions share: checked, then turned into SamplingParams."""

from __future__ import annotations

import logging

from trtllm_gateway.engine.protocol import ContextTooLongError, GuidedDecoding, SamplingParams
from trtllm_gateway.routers.openai import validation
from trtllm_gateway.routers.openai.schemas import SamplingFields
from trtllm_gateway.web.deps import Serving
from trtllm_gateway.web.errors import BadRequestError, ModelNotFoundError

logger = logging.getLogger(__name__)

MAX_LOGPROBS = 20


def check_common(body: SamplingFields, serving: Serving) -> None:
    """Checks shared by chat and completions that need no tokenizer."""
    if serving.mode in ("prefill", "encode"):
        raise BadRequestError(
            f"this instance runs in --mode {serving.mode} and only serves sibling "
            "instances; send generation requests to a decode or aggregated instance",
            code="wrong_mode",
        )
    # First: later errors may quote a field (a model name); text far past the context is
    # refused here, before the chat template or the tokenizer spends seconds on it.
    max_chars = serving.info.max_model_len * validation.MAX_CHARS_PER_TOKEN or None
    validation.check_stop_strings(body.stop_strings)  # quotes none: before the text bound
    validation.check_values(body, max_chars)
    if body.model not in (None, serving.model_name, *serving.info.lora_names):
        raise ModelNotFoundError(f"The model `{body.model}` does not exist.", param="model")
    if body.best_of is not None and body.best_of > 1:
        raise BadRequestError("best_of > 1 is not supported.", param="best_of")
    vocab = validation.vocab_bound(serving.info.vocab_size, serving.tokenizer.vocab_size)
    validation.check_sampling_ids(body, vocab)
    if body.model_extra:
        logger.debug("ignoring unknown request fields: %s", sorted(body.model_extra))


def check_logprobs(k: int | None, param: str, limit: int = MAX_LOGPROBS) -> None:
    if k is not None and k > limit:
        raise BadRequestError(f"{param} must be at most {limit}.", param=param)


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int) -> int:
    """The request's max_tokens, or the context that remains; too long is a 400 with both counts."""
    if prompt_tokens == 0:
        raise BadRequestError("The prompt is empty.", param="prompt")
    if prompt_tokens + max(requested or 0, 1) > max_model_len:
        raise ContextTooLongError(prompt_tokens, requested or 0, max_model_len)
    return requested if requested is not None else max_model_len - prompt_tokens


def sampling_params(
    body: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    seed_offset: int = 0,
    guided: GuidedDecoding | None = None,
) -> SamplingParams:
    """One choice's params; `seed_offset` keeps n seeded choices from sampling the same text."""
    top_k = body.top_k or 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if top_k < 0 else top_k,
        min_p=body.min_p or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        seed=None if body.seed is None else body.seed + seed_offset,
        min_tokens=min(body.min_tokens, max_tokens),
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        logit_bias=validation.logit_bias_pairs(body.logit_bias),
        allowed_token_ids=None if body.allowed_token_ids is None else tuple(body.allowed_token_ids),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        guided=guided,
        extra_args=tuple(
            (k, tuple(v) if isinstance(v, list) else v) for k, v in (body.vllm_xargs or {}).items()
        ),
    )
