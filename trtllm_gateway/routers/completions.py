"""POST /v1/completions: prompt(s) as text or token ids -> GenerateRequests -> engine -> render."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from trtllm_gateway.app.deps import Serving, ServingDep
from trtllm_gateway.app.errors import BadRequestError
from trtllm_gateway.engine.protocol import GenerateRequest, TokenLogprob
from trtllm_gateway.routers import generation as gen
from trtllm_gateway.routers import validation
from trtllm_gateway.routers.chunk_template import TextChunk
from trtllm_gateway.routers.render import ChoiceDelta, ChoiceRenderer, completion_logprobs
from trtllm_gateway.routers.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    PromptTokensDetails,
    UsageInfo,
)
from trtllm_gateway.routers.structured import build_constraint, check_constraint

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, request: Request, serving: ServingDep
) -> Response:
    arrival = time.monotonic()
    request_id = gen.new_request_id(request, "cmpl")
    weight = body.n * gen.prompt_count(body.prompt)
    return await gen.admitted(
        request, serving, weight, lambda: _complete(body, serving, request_id, arrival)
    )


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
    logprobs: CompletionLogprobs = field(default_factory=CompletionLogprobs)
    template: TextChunk | None = None  # the text-only chunk of this choice, once needed


def _check(body: CompletionRequest, serving: Serving) -> None:
    gen.check_common(body, serving)
    gen.check_logprobs(body.logprobs, "logprobs", serving.settings.max_logprobs)
    if body.suffix:
        raise BadRequestError("suffix is not supported.", param="suffix")
    for field_name in ("tools", "tool_choice"):
        if (body.model_extra or {}).get(field_name) is not None:
            raise BadRequestError(
                f"{field_name} is only supported on /v1/chat/completions.", param=field_name
            )
    if isinstance(body.prompt, list) and not body.prompt:
        raise BadRequestError("prompt must not be empty.", param="prompt")
    validation.check_choice_count(gen.prompt_count(body.prompt), body.n)


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


class _CompletionRun:
    def __init__(self, body: CompletionRequest, serving: Serving, request_id: str) -> None:
        self.body = body
        self.serving = serving
        self.request_id = request_id
        self.created = int(time.time())
        self.choices: list[_ChoiceText] = []
        opts = body.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous = bool(opts and opts.include_usage and opts.continuous_usage_stats)

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
        tok = self.serving.tokenizer
        text = delta.text
        token_ids = list(delta.token_ids)
        lps: list[TokenLogprob | None] = list(delta.logprobs)
        lps += [None] * (len(token_ids) - len(lps))
        if self.body.echo and not choice.echoed:
            choice.echoed = True
            prompt = choice.prompt
            text = (prompt.text if prompt.text is not None else tok.decode(prompt.token_ids)) + text
            prompt_lps: list[TokenLogprob | None] = [None, *(delta.prompt_logprobs or ())]
            prompt_lps += [None] * (len(prompt.token_ids) - len(prompt_lps))
            token_ids = prompt.token_ids + token_ids
            lps = prompt_lps[: len(prompt.token_ids)] + lps
        if self.body.logprobs is None:
            return text, None
        shaped = completion_logprobs(tok, token_ids, lps, self.body.logprobs, choice.offset)
        choice.offset += sum(len(t) for t in shaped.tokens)
        return text, shaped

    def render(self, index: int, delta: ChoiceDelta) -> Iterable[CompletionResponse | bytes]:
        if delta.is_empty and not (self.body.echo and not self.choices[index].echoed):
            return ()
        if self._plain(index, delta):
            return (self._template(index).render(delta.text),)
        text, logprobs = self._piece(index, delta)
        choice = CompletionChoice(
            index=index,
            text=text,
            logprobs=logprobs,
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
        )
        return (self._response([choice], self.usage() if self.continuous else None),)

    def _plain(self, index: int, delta: ChoiceDelta) -> bool:
        """A mid-stream chunk that is text only: rendered from the choice's template."""
        return (
            delta.finish_reason is None
            and self.body.logprobs is None
            and not self.continuous
            and (not self.body.echo or self.choices[index].echoed)
        )

    def _template(self, index: int) -> TextChunk:
        choice = self.choices[index]
        if choice.template is None:
            marked = CompletionChoice(index=index, text=TextChunk.marker())
            choice.template = TextChunk(self._response([marked], None))
        return choice.template

    def epilogue(self) -> list[CompletionResponse]:
        return [self._response([], self.usage())] if self.include_usage else []

    def _response(
        self, choices: list[CompletionChoice], usage: UsageInfo | None
    ) -> CompletionResponse:
        return CompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.serving.model_name,
            choices=choices,
            usage=usage,
        )

    def response(self, items: list[gen.Item]) -> CompletionResponse:
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
                logprobs=logprobs[i] if self.body.logprobs is not None else None,
                finish_reason=c.renderer.finish_reason,
                stop_reason=c.renderer.stop_reason,
            )
            for i, c in enumerate(self.choices)
        ]
        return self._response(choices, self.usage())


async def _complete(
    body: CompletionRequest, serving: Serving, request_id: str, arrival: float
) -> Response:
    _check(body, serving)
    constraint = build_constraint(body)
    if constraint is not None:
        await check_constraint(constraint, serving.settings.max_grammar_bytes)
    prompts = await asyncio.to_thread(_tokenize, body, serving)
    want_prompt_logprobs = body.echo and body.logprobs is not None
    run = _CompletionRun(body, serving, request_id)
    choices = []
    engine_ids = gen.engine_request_ids(request_id, len(prompts) * body.n)
    for p, prompt in enumerate(prompts):
        max_tokens = gen.resolve_max_tokens(
            body.max_tokens, len(prompt.token_ids), serving.info.max_model_len
        )
        for j in range(body.n):
            index = p * body.n + j
            sampling = gen.sampling_params(
                body,
                max_tokens,
                logprobs=body.logprobs,
                prompt_logprobs=body.logprobs if want_prompt_logprobs else None,
                seed_offset=j,
                guided=None if constraint is None else constraint.guided,
            )
            renderer = ChoiceRenderer(
                serving.tokenizer,
                prompt.token_ids,
                stop=body.stop_strings,
                include_stop_str_in_output=body.include_stop_str_in_output,
                stop_token_ids=sampling.stop_token_ids,
            )
            run.choices.append(_ChoiceText(prompt, renderer))
            req = GenerateRequest(engine_ids[index], tuple(prompt.token_ids), sampling)
            choices.append(gen.Choice(index, req, renderer))
    items = gen.start(serving, choices, arrival)
    headers = {"X-Request-Id": request_id}
    if body.stream:
        return await gen.stream_response(
            serving, request_id, items, ((), run.render, run.epilogue), headers
        )
    response = run.response(await gen.collect(await gen.peek(items), items))
    return JSONResponse(response.model_dump(mode="json"), headers=headers)
