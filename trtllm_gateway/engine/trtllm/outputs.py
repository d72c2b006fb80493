"""TensorRT-LLM results -> protocol TokenEvents: token diffs, logprobs (both forms), finishes.

TensorRT-LLM reuses one RequestOutput object for every streamed step, so everything here reads
the `*_diff` fields and copies them into frozen events before the caller awaits the next step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from trtllm_gateway.engine.protocol import FinishReason, TokenEvent, TokenLogprob, Usage

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "abort",
    "timeout": "abort",
}
LOGPROB_FLOOR = -9999.0  # what OpenAI-compatible servers send for -inf
UNKNOWN_LOGPROB = math.nan  # a token outside TensorRT-LLM's top-k: its value was not returned


def map_finish_reason(reason: str | None) -> FinishReason | None:
    """'stop'/'length' as is; 'cancelled' and 'timeout' -> 'abort'; None/'not_finished' -> None."""
    if reason is None:
        return None
    return _FINISH.get(reason)


def map_logprobs(
    entries: Sequence[Any], token_ids: Sequence[int], top_k: int
) -> tuple[TokenLogprob, ...]:
    """One TokenLogprob per token from `list[dict[token_id, Logprob]]` or legacy `list[float]`.

    top holds up to top_k (token_id, logprob) pairs, best first (by rank, then logprob). The
    dicts are the top k of the raw distribution without the sampled token added (TorchSampler),
    so a sampled token outside them has an unknown logprob: NaN (UNKNOWN_LOGPROB), which the
    renderer shows as OpenAI does for a token outside the top 20.
    """
    return tuple(
        _one_logprob(entry, token_id, top_k)
        for entry, token_id in zip(entries, token_ids, strict=False)
    )


def map_prompt_logprobs(
    entries: Sequence[Any], prompt_token_ids: Sequence[int], top_k: int
) -> tuple[TokenLogprob, ...]:
    """Prompt logprobs for every prompt token after the first (which has none).

    TensorRT-LLM gives one top-k dict per context position, entry t being the distribution
    after token t, so it scores token t+1 (the last one scores the first generated token).
    The dicts come from the context logits without the actual token: where it is not in
    the top k its logprob is unknown and is NaN here (UNKNOWN_LOGPROB), never a number.
    """
    return tuple(
        _prompt_logprob(entry, token_id, top_k)
        for entry, token_id in zip(entries, prompt_token_ids[1:], strict=False)
    )


def _prompt_logprob(entry: Any, token_id: int, top_k: int) -> TokenLogprob:
    if not isinstance(entry, dict):  # the legacy flat form carries the actual token's value
        return _one_logprob(entry, token_id, top_k)
    chosen = entry.get(token_id)
    value = _value(chosen) if chosen is not None else UNKNOWN_LOGPROB
    return TokenLogprob(token_id=token_id, logprob=value, top=_ranked(entry, top_k))


def _one_logprob(entry: Any, token_id: int, top_k: int) -> TokenLogprob:
    if isinstance(entry, dict):
        chosen = entry.get(token_id)
        value = _value(chosen) if chosen is not None else UNKNOWN_LOGPROB
        return TokenLogprob(token_id=token_id, logprob=value, top=_ranked(entry, top_k))
    value = _floor(float(entry))
    return TokenLogprob(token_id=token_id, logprob=value, top=((token_id, value),)[:top_k])


def _ranked(entry: dict[Any, Any], top_k: int) -> tuple[tuple[int, float], ...]:
    ranked = sorted(entry.items(), key=lambda kv: (_rank(kv[1]), -_value(kv[1])))
    return tuple((int(tid), _value(lp)) for tid, lp in ranked[:top_k])


def _value(lp: Any) -> float:
    return _floor(float(getattr(lp, "logprob", lp)))


def _rank(lp: Any) -> int:
    rank = getattr(lp, "rank", None)
    return rank if isinstance(rank, int) else 1 << 30


def _floor(value: float) -> float:
    return LOGPROB_FLOOR if math.isnan(value) or value < LOGPROB_FLOOR else value


def step_event(
    result: Any,
    *,
    prompt_tokens: int,
    logprobs_k: int | None,
    prompt_logprobs_k: int | None,
    first: bool,
    end_id: int | None = None,
) -> TokenEvent | None:
    """The event for one streamed step, or None when the step carries nothing new.

    Call before awaiting the next step: `result` is mutated in place by TensorRT-LLM.
    """
    out = result.outputs[0]
    token_ids = tuple(int(t) for t in out.token_ids_diff)
    finish = map_finish_reason(out.finish_reason) if result.finished else None
    if result.finished and finish is None:
        finish = "stop"  # context-only 'not_finished' never reaches here; be total anyway
    logprobs = None
    if logprobs_k is not None and token_ids:
        logprobs = map_logprobs(out.logprobs_diff, token_ids, logprobs_k)
    prompt_lps = None
    if first and prompt_logprobs_k is not None and out.prompt_logprobs:
        prompt_lps = map_prompt_logprobs(
            out.prompt_logprobs, result.prompt_token_ids, prompt_logprobs_k
        )
    if not token_ids and finish is None and prompt_lps is None:
        return None
    usage = None
    stop_token_id = None
    if finish is not None:
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(out.token_ids),
            cached_tokens=int(getattr(result, "cached_tokens", 0) or 0),
        )
        if finish == "stop":
            # A stop_token_ids match names its id; the end id leaves stop_reason None
            # (executor/result.py), and no stop strings are sent: None means end_id.
            stop_token_id = out.stop_reason if isinstance(out.stop_reason, int) else end_id
    return TokenEvent(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=finish,
        stop_token_id=stop_token_id,
        usage=usage,
        prompt_logprobs=prompt_lps,
    )
