"""The render step of /v1/chat/completions: role chunks first, then each choice's deltas as
content (or, with a reply plan, reasoning / content / tool-call deltas), usage as stream_options
ask; or the one response body."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.chat.reply import ChoiceReply, ReplyPlan
from trtllm_gateway.routers.openai.choice_output import ChoiceDelta, ChoiceOutput
from trtllm_gateway.routers.openai.fanout import Item
from trtllm_gateway.routers.openai.logprobs import chat_logprobs
from trtllm_gateway.routers.openai.renderer import Envelope, TextChunks
from trtllm_gateway.routers.openai.schemas import (
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


class ChatRenderer:
    """Chat's chunks and response: role chunks first, then content (or, with a reply plan,
    reasoning / content / tool-call deltas), usage as stream_options ask."""

    def __init__(
        self,
        envelope: Envelope,
        body: ChatCompletionRequest,
        tokenizer: Tokenizer,
        outputs: list[ChoiceOutput],
        plan: ReplyPlan,
        prompt_tokens: int,
    ) -> None:
        self.envelope = envelope
        self.tokenizer = tokenizer
        self.logprobs_on = bool(body.logprobs)
        self.top_n = body.top_logprobs or 0
        self.outputs = outputs
        self.plan = plan
        self.prompt_tokens = prompt_tokens
        # One parser per choice when the plan parses replies (reasoning, tool calls).
        self.replies = [
            ChoiceReply(plan.create(), plan.forced_tool is not None) for _ in outputs if plan.active
        ]
        self.text_chunks = TextChunks(self._text_chunk)

    def usage(self) -> UsageInfo:
        completion = sum(r.completion_tokens for r in self.outputs)
        # The engine's count once it has one: it expands image placeholders.
        engine_prompt = (r.usage.prompt_tokens for r in self.outputs if r.usage)
        prompt = max(engine_prompt, default=self.prompt_tokens)
        cached = max((r.usage.cached_tokens for r in self.outputs if r.usage), default=0)
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
            for i in range(len(self.outputs))
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
        logprobs: list[list[ChatLogprob]] = [[] for _ in self.outputs]
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
            for i, r in enumerate(self.outputs)
        ]
        env = self.envelope
        return ChatCompletionResponse(
            id=env.request_id,
            created=env.created,
            model=env.model,
            choices=choices,
            usage=self.usage(),
        )

    def _message(self, index: int, output: ChoiceOutput) -> ChatResponseMessage:
        if self.replies:
            return self.replies[index].message()
        return ChatResponseMessage(content=output.text)
