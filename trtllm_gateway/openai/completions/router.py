"""POST /v1/completions: prompt(s) as text or token ids -> choices on a GenerationRun ->
CompletionRenderer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trtllm_gateway.app.deps import Serving, ServingDep
from trtllm_gateway.app.errors import BadRequestError
from trtllm_gateway.engine.protocol import TokenLogprob
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.openai import sampling, validation
from trtllm_gateway.openai.choice_output import ChoiceDelta, ChoiceRenderer, completion_logprobs
from trtllm_gateway.openai.fanout import Item
from trtllm_gateway.openai.renderer import Envelope, TextChunks
from trtllm_gateway.openai.run import GenerationRun, serve
from trtllm_gateway.openai.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    PromptTokensDetails,
    UsageInfo,
)
from trtllm_gateway.openai.structured import build_constraint, check_constraint

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, request: Request, serving: ServingDep
) -> Response:
    weight = body.n * prompt_count(body.prompt)
    return await serve(
        request, serving, body, "cmpl", weight, lambda run: _parse(body, serving, run)
    )


def prompt_count(prompt: object) -> int:
    """Prompts in a completions `prompt` (text, token ids, or a batch of either), unparsed."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


@dataclass(slots=True)
class _Prompt:
    token_ids: list[int]
    text: str | None  # as sent, when sent as text


@dataclass(slots=True)
class _ChoiceText:
    """Per-choice echo and text_offset bookkeeping across chunks."""

    prompt: _Prompt
    renderer: ChoiceRenderer
    echoed: bool = False
    offset: int = 0


def _check(body: CompletionRequest, serving: Serving) -> None:
    sampling.check_common(body, serving)
    sampling.check_logprobs(body.logprobs, "logprobs", serving.settings.max_logprobs)
    if body.suffix:
        raise BadRequestError("suffix is not supported.", param="suffix")
    for field_name in ("tools", "tool_choice"):
        if (body.model_extra or {}).get(field_name) is not None:
            raise BadRequestError(
                f"{field_name} is only supported on /v1/chat/completions.", param=field_name
            )
    if isinstance(body.prompt, list) and not body.prompt:
        raise BadRequestError("prompt must not be empty.", param="prompt")
    validation.check_choice_count(prompt_count(body.prompt), body.n)


def _tokenize(body: CompletionRequest, serving: Serving) -> list[_Prompt]:
    tok = serving.tokenizer
    prompt = body.prompt
    if isinstance(prompt, str):
        return [_Prompt(tok.encode(prompt), prompt)]
    if all(isinstance(p, str) for p in prompt):
        return [_Prompt(tok.encode(str(p)), str(p)) for p in prompt]
    id_lists = [prompt] if all(isinstance(p, int) for p in prompt) else prompt
    vocab = validation.vocab_bound(serving.info.vocab_size, tok.vocab_size)
    out = []
    for ids in id_lists:
        token_ids = [t for t in ids if isinstance(t, int)] if isinstance(ids, list) else []
        if len(token_ids) != (len(ids) if isinstance(ids, list) else -1):
            raise BadRequestError("prompt must be text or token ids.", param="prompt")
        validation.check_token_ids(token_ids, vocab, "prompt")
        out.append(_Prompt(token_ids, None))
    return out


async def _parse(
    body: CompletionRequest, serving: Serving, run: GenerationRun
) -> CompletionRenderer:
    """Checks, tokenization, then n choices per prompt (choice index = prompt * n + j)."""
    _check(body, serving)
    constraint = build_constraint(body)
    if constraint is not None:
        await check_constraint(constraint, serving.settings.max_grammar_bytes)
    prompts = await asyncio.to_thread(_tokenize, body, serving)
    want_prompt_logprobs = body.echo and body.logprobs is not None
    choices = []
    for prompt in prompts:
        max_tokens = sampling.resolve_max_tokens(
            body.max_tokens, len(prompt.token_ids), serving.info.max_model_len
        )
        for j in range(body.n):
            params = sampling.sampling_params(
                body,
                max_tokens,
                logprobs=body.logprobs,
                prompt_logprobs=body.logprobs if want_prompt_logprobs else None,
                seed_offset=j,
                guided=None if constraint is None else constraint.guided,
            )
            choices.append(_ChoiceText(prompt, run.add(prompt.token_ids, params)))
    return CompletionRenderer(run.envelope, body, serving.tokenizer, choices)


class CompletionRenderer:
    """Completions' chunks and response: text (the prompt first under echo), legacy logprobs
    with text offsets, usage as stream_options ask; no prelude."""

    def __init__(
        self,
        envelope: Envelope,
        body: CompletionRequest,
        tokenizer: Tokenizer,
        choices: list[_ChoiceText],
    ) -> None:
        self.envelope = envelope
        self.echo = body.echo
        self.top_n = body.logprobs  # None: no logprobs
        self.tokenizer = tokenizer
        self.choices = choices
        self.text_chunks = TextChunks(
            lambda index, text: self._response([CompletionChoice(index=index, text=text)], None)
        )

    def usage(self) -> UsageInfo:
        prompts = {id(c.prompt): len(c.prompt.token_ids) for c in self.choices}
        renderers = [c.renderer for c in self.choices]
        prompt = sum(prompts.values())
        completion = sum(r.completion_tokens for r in renderers)
        cached = sum(r.usage.cached_tokens for r in renderers if r.usage)
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
                finish_reason=c.renderer.finish_reason,
                stop_reason=c.renderer.stop_reason,
            )
            for i, c in enumerate(self.choices)
        ]
        return self._response(choices, self.usage())
