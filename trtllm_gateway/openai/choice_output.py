"""TokenEvents -> text deltas for one choice (stop strings with hold-back), and logprob shapes.

ChoiceRenderer is synchronous and pure: feed it each TokenEvent of one engine request and it
returns what may be shown now. Text that could still turn out to be the start of a stop string
is held back; a multi-byte character split across tokens is held back by the detokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trtllm_gateway.engine.protocol import FinishReason, TokenEvent, TokenLogprob, Usage
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.openai.schemas import ChatLogprob, CompletionLogprobs, TopLogprob

LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf so the JSON stays finite


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """What one choice shows after one event."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None

    @property
    def is_empty(self) -> bool:
        return not self.text and not self.logprobs and self.finish_reason is None


class ChoiceRenderer:
    """Detokenizes one engine request and applies stop strings; `finished` says stop iterating."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        stop_token_ids: Sequence[int] = (),
        keep_special_tokens: bool = False,
    ) -> None:
        # keep_special_tokens: tool-call and reasoning formats whose markers are special tokens
        # (the final stop token itself is still left out, as vLLM does).
        self._detok = tokenizer.detokenizer(prompt_token_ids, not keep_special_tokens)
        self._keep_special = keep_special_tokens
        self._stop = tuple(s for s in stop if s)
        self._include_stop = include_stop_str_in_output
        self._stop_token_ids = frozenset(stop_token_ids)
        self._text = ""
        self._emitted = 0
        self.prompt_tokens = len(prompt_token_ids)
        self.completion_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.usage: Usage | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return self._text[: self._emitted]

    def feed(self, event: TokenEvent) -> ChoiceDelta:
        if self.finished:
            raise RuntimeError("feed() after the choice finished")
        self.completion_tokens += len(event.token_ids)
        if event.usage is not None:
            self.usage = event.usage
        token_ids = event.token_ids
        if (
            self._keep_special
            and event.stop_token_id is not None
            and token_ids[-1:] == (event.stop_token_id,)
        ):
            token_ids = token_ids[:-1]
        new = self._detok.add(token_ids)
        if event.finish_reason is not None:
            new += self._detok.flush()
        self._text += new
        end = self._apply_stop_strings()
        if end is None:
            if event.finish_reason is not None:
                end = len(self._text)
                self.finish_reason = event.finish_reason
                if event.stop_token_id in self._stop_token_ids:
                    self.stop_reason = event.stop_token_id
            else:
                end = len(self._text) - self._held_back()
        text = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return ChoiceDelta(
            text=text,
            token_ids=event.token_ids,
            logprobs=event.logprobs or (),
            prompt_logprobs=event.prompt_logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )

    def _apply_stop_strings(self) -> int | None:
        """If a stop string appeared, finish and return where the visible text ends."""
        best: tuple[int, str] | None = None
        for stop in self._stop:
            # Held-back text guarantees a match cannot start before what was emitted.
            idx = self._text.find(stop, self._emitted)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return None
        idx, stop = best
        end = idx + len(stop) if self._include_stop else idx
        self._text = self._text[: idx + len(stop)]
        self.finish_reason = "stop"
        self.stop_reason = stop
        return end

    def _held_back(self) -> int:
        """Length of the longest unemitted suffix that is a proper prefix of a stop string."""
        pending = len(self._text) - self._emitted
        held = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, pending), held, -1):
                if self._text.endswith(stop[:k]):
                    held = k
                    break
        return held


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
