"""One choice's output: TokenEvents -> text deltas (stop strings with hold-back) and its counts.

ChoiceOutput is synchronous and pure: feed it each TokenEvent of one engine request and it
returns what may be shown now. Text that could still turn out to be the start of a stop string
is held back; a multi-byte character split across tokens is held back by the detokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtllm_gateway.engine.protocol import FinishReason, TokenEvent, TokenLogprob, Usage
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.stop_strings import ROOT, compile_stops


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


class ChoiceOutput:
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
        self._stops = compile_stops(tuple(stop))
        self._state = ROOT  # the stop automaton's, after every character of _text
        self._scanned = 0
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
        """If a stop string appeared, finish and return where the visible text ends.

        Only the new text is scanned: a stop that started earlier is still a suffix of the
        automaton's state, and held-back text guarantees no match starts before what was
        emitted."""
        if not self._stops:
            return None
        self._state, match = self._stops.scan(self._text, self._scanned, self._state)
        self._scanned = len(self._text)
        if match is None:
            return None
        idx, stop = match.start, match.stop
        end = idx + len(stop) if self._include_stop else idx
        self._text = self._text[: idx + len(stop)]
        self.finish_reason = "stop"
        self.stop_reason = stop
        return end

    def _held_back(self) -> int:
        """Length of the longest unemitted suffix that is a proper prefix of a stop string."""
        if not self._stops:
            return 0
        return min(self._stops.held(self._state), len(self._text) - self._emitted)
