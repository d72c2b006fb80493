"""Logprob wire shapes: chat's {token, logprob, bytes, top_logprobs} and the legacy completions
shape with text offsets, both from the engine's TokenLogprobs."""

from __future__ import annotations

import math
from collections.abc import Sequence

from trtllm_gateway.engine.protocol import TokenLogprob
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.schemas import ChatLogprob, CompletionLogprobs, TopLogprob

LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf so the JSON stays finite


def clamp(logprob: float) -> float:
    """-inf and below-floor values become the floor; so does NaN, an unknown value (a token
    outside TensorRT-LLM's top 20): OpenAI's chat schema has no null for `logprob` and
    documents -9999.0 as "not within the top 20 most likely tokens"."""
    return logprob if logprob > LOGPROB_FLOOR else LOGPROB_FLOOR


def chat_logprobs(
    tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob], top_n: int
) -> list[ChatLogprob]:
    """The chat shape: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}."""
    out = []
    for lp in logprobs:
        top = [
            TopLogprob(
                token=tokenizer.token_text(tid),
                logprob=clamp(value),
                bytes=list(tokenizer.token_bytes(tid)),
            )
            for tid, value in lp.top[:top_n]
        ]
        out.append(
            ChatLogprob(
                token=tokenizer.token_text(lp.token_id),
                logprob=clamp(lp.logprob),
                bytes=list(tokenizer.token_bytes(lp.token_id)),
                top_logprobs=top,
            )
        )
    return out


def completion_logprobs(
    tokenizer: Tokenizer,
    token_ids: Sequence[int],
    logprobs: Sequence[TokenLogprob | None],
    top_n: int,
    text_offset: int,
) -> CompletionLogprobs:
    """The legacy shape; a None entry (the first prompt token under echo) has no logprob.

    top_logprobs dicts hold the top_n alternatives plus the chosen token, as vLLM does.
    """
    shaped = CompletionLogprobs()
    for tid, lp in zip(token_ids, logprobs, strict=True):
        token = tokenizer.token_text(tid)
        shaped.tokens.append(token)
        shaped.text_offset.append(text_offset)
        text_offset += len(token)
        if lp is None:
            shaped.token_logprobs.append(None)
            shaped.top_logprobs.append(None)
            continue
        top = {tokenizer.token_text(t): clamp(v) for t, v in lp.top[:top_n]}
        if math.isnan(lp.logprob):
            # Unknown (TensorRT-LLM returned only a top-k without this token, prompt or
            # sampled): null, which the legacy schema allows, never a made-up value.
            shaped.token_logprobs.append(None)
        else:
            shaped.token_logprobs.append(clamp(lp.logprob))
            top.setdefault(token, clamp(lp.logprob))
        shaped.top_logprobs.append(top)
    return shaped
