"""POST /v1/chat/completions: schema -> chat template -> choices on a GenerationRun, rendered by
ChatRenderer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trtllm_gateway.app.deps import Serving, ServingDep, StateDep
from trtllm_gateway.app.errors import BadRequestError
from trtllm_gateway.app.state import State
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.openai import sampling
from trtllm_gateway.openai.chat.agent import (
    ChoiceReply,
    guided_decoding,
    reply_plan,
    template_kwargs,
    template_tools,
)
from trtllm_gateway.openai.chat.images import load_images, template_messages
from trtllm_gateway.openai.chat.reply import ReplyPlan
from trtllm_gateway.openai.choice_output import ChoiceDelta, ChoiceRenderer, chat_logprobs
from trtllm_gateway.openai.fanout import Item
from trtllm_gateway.openai.renderer import Envelope, TextChunks
from trtllm_gateway.openai.run import GenerationRun, serve
from trtllm_gateway.openai.schemas import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprob,
    ChatLogprobs,
    ChatResponseMessage,
    CompletionTokensDetails,
    DeltaMessage,
    PromptTokensDetails,
    UsageInfo,
)
from trtllm_gateway.openai.structured import build_constraint, check_tools

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, serving: ServingDep, state: StateDep
) -> Response:
    return await serve(
        request, serving, body, "chatcmpl", body.n, lambda run: _parse(body, serving, state, run)
    )


def _check(body: ChatCompletionRequest, serving: Serving) -> None:
    sampling.check_common(body, serving)
    if not body.messages:
        raise BadRequestError("messages must not be empty.", param="messages")
    if body.top_logprobs and not body.logprobs:
        raise BadRequestError("top_logprobs requires logprobs=true.", param="top_logprobs")
    sampling.check_logprobs(body.top_logprobs, "top_logprobs", serving.settings.max_logprobs)
    check_tools(body)


async def _parse(
    body: ChatCompletionRequest, serving: Serving, state: State, run: GenerationRun
) -> ChatRenderer:
    """Checks, images, the chat template, then n choices over the one prompt."""
    _check(body, serving)
    constraint = build_constraint(body)  # its 400s before any templating or fetching
    images = tuple(await load_images(body.messages, serving.info, state))
    messages = template_messages(body.messages, serving.tokenizer)
    prompt = await asyncio.to_thread(
        serving.tokenizer.encode_chat,
        messages,
        add_generation_prompt=body.add_generation_prompt,
        chat_template_kwargs=template_kwargs(body),
        tools=template_tools(body),
    )
    requested = body.max_completion_tokens or body.max_tokens
    max_tokens = sampling.resolve_max_tokens(requested, len(prompt), serving.info.max_model_len)
    plan = reply_plan(body, serving, prompt)
    guided = await guided_decoding(constraint, serving, plan)
    top_n = body.top_logprobs or 0
    for i in range(body.n):
        params = sampling.sampling_params(
            body,
            max_tokens,
            logprobs=top_n if body.logprobs else None,
            seed_offset=i,
            guided=guided,
        )
        run.add(prompt, params, images, keep_special_tokens=plan.keeps_special_tokens)
    renderers = [c.renderer for c in run.choices]
    return ChatRenderer(run.envelope, body, serving.tokenizer, renderers, plan, len(prompt))


class ChatRenderer:
    """Chat's chunks and response: role chunks first, then content (or, with a reply plan,
    reasoning / content / tool-call deltas), usage as stream_options ask."""

    def __init__(
        self,
        envelope: Envelope,
        body: ChatCompletionRequest,
        tokenizer: Tokenizer,
        renderers: list[ChoiceRenderer],
        plan: ReplyPlan,
        prompt_tokens: int,
    ) -> None:
        self.envelope = envelope
        self.tokenizer = tokenizer
        self.logprobs_on = bool(body.logprobs)
        self.top_n = body.top_logprobs or 0
        self.renderers = renderers
        self.plan = plan
        self.prompt_tokens = prompt_tokens
        # One parser per choice when the plan parses replies (reasoning, tool calls).
        self.replies = [
            ChoiceReply(plan.create(), plan.forced_tool is not None)
            for _ in renderers
            if plan.active
        ]
        self.text_chunks = TextChunks(self._text_chunk)

    def usage(self) -> UsageInfo:
        completion = sum(r.completion_tokens for r in self.renderers)
        # The engine's count once it has one: it expands image placeholders.
        engine_prompt = (r.usage.prompt_tokens for r in self.renderers if r.usage)
        prompt = max(engine_prompt, default=self.prompt_tokens)
        cached = max((r.usage.cached_tokens for r in self.renderers if r.usage), default=0)
        details = None
        if self.plan.reasoning is not None:
            reasoning = sum(r.fold.reasoning_tokens for r in self.replies)
            details = CompletionTokensDetails(reasoning_tokens=reasoning)
        return UsageInfo(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
            completion_tokens_details=details,
        )

    def chunk(self, choices: list[ChatCompletionChunkChoice]) -> ChatCompletionChunk:
        return self._chunk(choices, self.usage() if self.envelope.continuous else None)

    def _chunk(
        self, choices: list[ChatCompletionChunkChoice], usage: UsageInfo | None
    ) -> ChatCompletionChunk:
        env = self.envelope
        return ChatCompletionChunk(
            id=env.request_id, created=env.created, model=env.model, choices=choices, usage=usage
        )

    def _text_chunk(self, index: int, text: str) -> ChatCompletionChunk:
        return self.chunk(
            [ChatCompletionChunkChoice(index=index, delta=DeltaMessage(content=text))]
        )

    def logprobs(self, delta: ChoiceDelta) -> list[ChatLogprob] | None:
        if not self.logprobs_on:
            return None
        return chat_logprobs(self.tokenizer, delta.logprobs, self.top_n)

    def prelude(self) -> list[ChatCompletionChunk]:
        # OpenAI's first delta of a tool call has no content, so a client that accumulates the
        # stream (the SDK's stream helper) ends with content None, as the non-streamed message
        # has; a text reply starts with content "".
        calls = self.plan.forced_tool is not None or self.plan.required or self.plan.tool_family
        role = DeltaMessage(role="assistant", content=None if calls else "")
        return [
            self.chunk([ChatCompletionChunkChoice(index=i, delta=role)])
            for i in range(len(self.renderers))
        ]

    def chunks(self, index: int, delta: ChoiceDelta) -> Iterable[ChatCompletionChunk | bytes]:
        if delta.is_empty:
            return ()
        if self.replies:
            return self._parsed_chunks(index, delta)
        if delta.finish_reason is None and not self.logprobs_on and not self.envelope.continuous:
            return (self.text_chunks.render(index, delta.text),)  # text only: the common chunk
        content = self.logprobs(delta)
        choice = ChatCompletionChunkChoice(
            index=index,
            delta=DeltaMessage(content=delta.text),
            logprobs=None if content is None else ChatLogprobs(content=content),
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
        )
        return (self.chunk([choice]),)

    def _parsed_chunks(self, index: int, delta: ChoiceDelta) -> Iterable[ChatCompletionChunk]:
        parsed, finish = self.replies[index].feed(delta)
        content = self.logprobs(delta)
        if parsed.is_empty and finish is None and not content:
            return ()  # held back (a marker may be starting); nothing to show yet
        choice = ChatCompletionChunkChoice(
            index=index,
            delta=ChoiceReply.delta_message(parsed),
            logprobs=None if content is None else ChatLogprobs(content=content),
            finish_reason=finish,
            stop_reason=delta.stop_reason,
        )
        return (self.chunk([choice]),)

    def epilogue(self) -> list[ChatCompletionChunk]:
        return [self._chunk([], self.usage())] if self.envelope.include_usage else []

    def response(self, items: Sequence[Item]) -> ChatCompletionResponse:
        logprobs: list[list[ChatLogprob]] = [[] for _ in self.renderers]
        for index, delta in items:
            logprobs[index].extend(self.logprobs(delta) or ())
            if self.replies:
                self.replies[index].feed(delta)  # the same fold the stream renders
        choices = [
            ChatCompletionChoice(
                index=i,
                message=self._message(i, r),
                logprobs=ChatLogprobs(content=logprobs[i]) if self.logprobs_on else None,
                finish_reason=self.replies[i].finish_reason(r.finish_reason)
                if self.replies
                else r.finish_reason,
                stop_reason=r.stop_reason,
            )
            for i, r in enumerate(self.renderers)
        ]
        env = self.envelope
        return ChatCompletionResponse(
            id=env.request_id,
            created=env.created,
            model=env.model,
            choices=choices,
            usage=self.usage(),
        )

    def _message(self, index: int, renderer: ChoiceRenderer) -> ChatResponseMessage:
        if self.replies:
            return self.replies[index].message()
        return ChatResponseMessage(content=renderer.text)
