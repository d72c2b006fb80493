"""POST /v1/chat/completions: schema -> chat template -> GenerateRequest(s) -> engine -> render."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from trtllm_gateway.app.deps import Serving, ServingDep, StateDep
from trtllm_gateway.app.errors import BadRequestError
from trtllm_gateway.app.state import State
from trtllm_gateway.engine.protocol import GenerateRequest
from trtllm_gateway.routers import generation as gen
from trtllm_gateway.routers.chat_agent import (
    ChoiceReply,
    guided_decoding,
    reply_plan,
    template_kwargs,
    template_tools,
)
from trtllm_gateway.routers.chat_images import load_images, template_messages
from trtllm_gateway.routers.chunk_template import TextChunk
from trtllm_gateway.routers.render import ChoiceDelta, ChoiceRenderer, chat_logprobs
from trtllm_gateway.routers.reply import ReplyPlan
from trtllm_gateway.routers.schemas import (
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
from trtllm_gateway.routers.structured import build_constraint, check_tools

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, serving: ServingDep, state: StateDep
) -> Response:
    arrival = time.monotonic()
    request_id = gen.new_request_id(request, "chatcmpl")
    return await gen.admitted(
        request, serving, body.n, lambda: _chat(body, serving, state, request_id, arrival)
    )


def _check(body: ChatCompletionRequest, serving: Serving) -> None:
    gen.check_common(body, serving)
    if not body.messages:
        raise BadRequestError("messages must not be empty.", param="messages")
    if body.top_logprobs and not body.logprobs:
        raise BadRequestError("top_logprobs requires logprobs=true.", param="top_logprobs")
    gen.check_logprobs(body.top_logprobs, "top_logprobs", serving.settings.max_logprobs)
    check_tools(body)


class _ChatRun:
    """Everything one request's chunks are built from."""

    def __init__(self, body: ChatCompletionRequest, serving: Serving, request_id: str) -> None:
        self.body = body
        self.serving = serving
        self.request_id = request_id
        self.created = int(time.time())
        self.top_n = body.top_logprobs or 0
        self.renderers: list[ChoiceRenderer] = []
        self.templates: dict[int, TextChunk] = {}  # text-only chunk per choice index
        self.prompt_tokens = 0
        self.plan = ReplyPlan()
        self.replies: list[ChoiceReply] = []  # one per choice when the plan parses replies
        opts = body.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous = bool(opts and opts.include_usage and opts.continuous_usage_stats)

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
        return ChatCompletionChunk(
            id=self.request_id,
            created=self.created,
            model=self.serving.model_name,
            choices=choices,
            usage=self.usage() if self.continuous else None,
        )

    def logprobs(self, delta: ChoiceDelta) -> list[ChatLogprob] | None:
        if not self.body.logprobs:
            return None
        return chat_logprobs(self.serving.tokenizer, delta.logprobs, self.top_n)

    def prelude(self) -> list[ChatCompletionChunk]:
        role = DeltaMessage(role="assistant", content="")
        return [
            self.chunk([ChatCompletionChunkChoice(index=i, delta=role)])
            for i in range(len(self.renderers))
        ]

    def render(self, index: int, delta: ChoiceDelta) -> Iterable[ChatCompletionChunk | bytes]:
        if delta.is_empty:
            return ()
        if self.replies:
            return self._render_parsed(index, delta)
        if delta.finish_reason is None and not self.body.logprobs and not self.continuous:
            return (self._template(index).render(delta.text),)  # text only: the common chunk
        content = self.logprobs(delta)
        choice = ChatCompletionChunkChoice(
            index=index,
            delta=DeltaMessage(content=delta.text),
            logprobs=None if content is None else ChatLogprobs(content=content),
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
        )
        return (self.chunk([choice]),)

    def _render_parsed(self, index: int, delta: ChoiceDelta) -> Iterable[ChatCompletionChunk]:
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

    def _template(self, index: int) -> TextChunk:
        template = self.templates.get(index)
        if template is None:
            delta = DeltaMessage(content=TextChunk.marker())
            marked = self.chunk([ChatCompletionChunkChoice(index=index, delta=delta)])
            template = self.templates[index] = TextChunk(marked)
        return template

    def epilogue(self) -> list[ChatCompletionChunk]:
        if not self.include_usage:
            return []
        return [
            ChatCompletionChunk(
                id=self.request_id,
                created=self.created,
                model=self.serving.model_name,
                choices=[],
                usage=self.usage(),
            )
        ]

    def response(self, items: list[gen.Item]) -> ChatCompletionResponse:
        logprobs: list[list[ChatLogprob]] = [[] for _ in self.renderers]
        for index, delta in items:
            logprobs[index].extend(self.logprobs(delta) or ())
            if self.replies:
                self.replies[index].feed(delta)  # the same fold the stream renders
        choices = [
            ChatCompletionChoice(
                index=i,
                message=self._message(i, r),
                logprobs=ChatLogprobs(content=logprobs[i]) if self.body.logprobs else None,
                finish_reason=self.replies[i].finish_reason(r.finish_reason)
                if self.replies
                else r.finish_reason,
                stop_reason=r.stop_reason,
            )
            for i, r in enumerate(self.renderers)
        ]
        return ChatCompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.serving.model_name,
            choices=choices,
            usage=self.usage(),
        )

    def _message(self, index: int, renderer: ChoiceRenderer) -> ChatResponseMessage:
        if self.replies:
            return self.replies[index].message()
        return ChatResponseMessage(content=renderer.text)


async def _chat(
    body: ChatCompletionRequest, serving: Serving, state: State, request_id: str, arrival: float
) -> Response:
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
    max_tokens = gen.resolve_max_tokens(requested, len(prompt), serving.info.max_model_len)
    run = _ChatRun(body, serving, request_id)
    run.prompt_tokens = len(prompt)
    run.plan = reply_plan(body, serving, prompt)
    guided = await guided_decoding(constraint, serving, run.plan)
    choices = []
    engine_ids = gen.engine_request_ids(request_id, body.n)
    for i in range(body.n):
        sampling = gen.sampling_params(
            body,
            max_tokens,
            logprobs=run.top_n if body.logprobs else None,
            seed_offset=i,
            guided=guided,
        )
        renderer = ChoiceRenderer(
            serving.tokenizer,
            prompt,
            stop=body.stop_strings,
            include_stop_str_in_output=body.include_stop_str_in_output,
            stop_token_ids=sampling.stop_token_ids,
            keep_special_tokens=run.plan.keeps_special_tokens,
        )
        run.renderers.append(renderer)
        if run.plan.active:
            run.replies.append(ChoiceReply(run.plan.create(), run.plan.forced_tool is not None))
        req = GenerateRequest(engine_ids[i], tuple(prompt), sampling, images)
        choices.append(gen.Choice(i, req, renderer))
    items = gen.start(serving, choices, arrival)
    prelude = run.prelude()  # before the peek: role chunks report zero completion tokens
    headers = {"X-Request-Id": request_id}
    if body.stream:
        return await gen.stream_response(
            serving, request_id, items, (prelude, run.render, run.epilogue), headers
        )
    response = run.response(await gen.collect(await gen.peek(items), items))
    return JSONResponse(response.model_dump(mode="json"), headers=headers)
