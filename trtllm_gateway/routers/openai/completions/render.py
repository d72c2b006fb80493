"""The render step of /v1/completions: text (the prompt first under echo), legacy logprobs with
text offsets, usage as stream_options ask; no prelude. Or the one response body."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trtllm_gateway.engine.protocol import TokenLogprob
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.choice_output import ChoiceDelta, ChoiceOutput
from trtllm_gateway.routers.openai.completions.parse import Prompt
from trtllm_gateway.routers.openai.fanout import Item
from trtllm_gateway.routers.openai.logprobs import completion_logprobs
from trtllm_gateway.routers.openai.renderer import Envelope, TextChunks
from trtllm_gateway.routers.openai.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    PromptTokensDetails,
    UsageInfo,
)


@dataclass(slots=True)
class _ChoiceText:
    """Per-choice echo and text_offset bookkeeping across chunks."""

    prompt: Prompt
    output: ChoiceOutput
    echoed: bool = False
    offset: int = 0


class CompletionRenderer:
    """Completions' chunks and response."""

    def __init__(
        self,
        envelope: Envelope,
        body: CompletionRequest,
        tokenizer: Tokenizer,
        outputs: Sequence[ChoiceOutput],
        prompts: Sequence[Prompt],
    ) -> None:
        """`prompts[i]`: choice i's prompt (choices of one prompt share it)."""
        self.envelope = envelope
        self.echo = body.echo
        self.top_n = body.logprobs  # None: no logprobs
        self.tokenizer = tokenizer
        self.choices = [_ChoiceText(p, o) for p, o in zip(prompts, outputs, strict=True)]
        self.text_chunks = TextChunks(
            lambda index, text: self._response([CompletionChoice(index=index, text=text)], None)
        )

    def usage(self) -> UsageInfo:
        prompts = {id(c.prompt): len(c.prompt.token_ids) for c in self.choices}
        outputs = [c.output for c in self.choices]
        prompt = sum(prompts.values())
        completion = sum(o.completion_tokens for o in outputs)
        cached = sum(o.usage.cached_tokens for o in outputs if o.usage)
        return UsageInfo(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )

    def _piece(self, index: int, delta: ChoiceDelta) -> tuple[str, CompletionLogprobs | None]:
        """The text (with the echoed prompt first, once) and legacy logprobs of one delta."""
        choice = self.choices[index]
        tok = self.tokenizer
        text = delta.text
        token_ids = list(delta.token_ids)
        lps: list[TokenLogprob | None] = list(delta.logprobs)
        lps += [None] * (len(token_ids) - len(lps))
        if self.echo and not choice.echoed:
            choice.echoed = True
            prompt = choice.prompt
            text = (prompt.text if prompt.text is not None else tok.decode(prompt.token_ids)) + text
            prompt_lps: list[TokenLogprob | None] = [None, *(delta.prompt_logprobs or ())]
            prompt_lps += [None] * (len(prompt.token_ids) - len(prompt_lps))
            token_ids = prompt.token_ids + token_ids
            lps = prompt_lps[: len(prompt.token_ids)] + lps
        if self.top_n is None:
            return text, None
        shaped = completion_logprobs(tok, token_ids, lps, self.top_n, choice.offset)
        choice.offset += sum(len(t) for t in shaped.tokens)
        return text, shaped

    def prelude(self) -> tuple[()]:
        return ()

    def chunks(self, index: int, delta: ChoiceDelta) -> Iterable[CompletionResponse | bytes]:
        if delta.is_empty and not (self.echo and not self.choices[index].echoed):
            return ()
        if self._plain(index, delta):
            return (self.text_chunks.render(index, delta.text),)
        text, logprobs = self._piece(index, delta)
        choice = CompletionChoice(
            index=index,
            text=text,
            logprobs=logprobs,
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
        )
        return (self._response([choice], self.usage() if self.envelope.continuous else None),)

    def _plain(self, index: int, delta: ChoiceDelta) -> bool:
        """A mid-stream chunk that is text only: rendered from the choice's template."""
        return (
            delta.finish_reason is None
            and self.top_n is None
            and not self.envelope.continuous
            and (not self.echo or self.choices[index].echoed)
        )

    def epilogue(self) -> list[CompletionResponse]:
        return [self._response([], self.usage())] if self.envelope.include_usage else []

    def _response(
        self, choices: list[CompletionChoice], usage: UsageInfo | None
    ) -> CompletionResponse:
        env = self.envelope
        return CompletionResponse(
            id=env.request_id, created=env.created, model=env.model, choices=choices, usage=usage
        )

    def response(self, items: Sequence[Item]) -> CompletionResponse:
        texts = [""] * len(self.choices)
        logprobs = [CompletionLogprobs() for _ in self.choices]
        for index, delta in items:
            text, shaped = self._piece(index, delta)
            texts[index] += text
            if shaped is not None:
                for name in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
                    getattr(logprobs[index], name).extend(getattr(shaped, name))
        choices = [
            CompletionChoice(
                index=i,
                text=texts[i],
                logprobs=logprobs[i] if self.top_n is not None else None,
                finish_reason=c.output.finish_reason,
                stop_reason=c.output.stop_reason,
            )
            for i, c in enumerate(self.choices)
        ]
        return self._response(choices, self.usage())
