"""The agent side of one chat request: its output constraint and reply plan, and each choice's
reply rendered as reasoning / content / tool-call deltas (openai/chat/reply.py does the parsing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trtllm_gateway.app.deps import Serving
from trtllm_gateway.engine.protocol import GuidedDecoding
from trtllm_gateway.openai.chat.reply import ReplyFold, ReplyParser, ReplyPlan, delta_tool_calls
from trtllm_gateway.openai.choice_output import ChoiceDelta
from trtllm_gateway.openai.schemas import ChatCompletionRequest, ChatResponseMessage, DeltaMessage
from trtllm_gateway.openai.structured import Constraint, check_constraint, named_tool, start_after
from trtllm_gateway.reasoning import end_marker
from trtllm_gateway.tool_parsers import MessageDelta, resolve_tool_parser


def template_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as the chat template takes them (OpenAI's shape, unset fields left out)."""
    if not body.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in body.tools]


def template_kwargs(body: ChatCompletionRequest) -> dict[str, Any] | None:
    """chat_template_kwargs, with OpenAI's reasoning_effort passed as the template variable of
    that name (gpt-oss) unless the kwargs set it."""
    if body.reasoning_effort is None:
        return body.chat_template_kwargs
    return {"reasoning_effort": body.reasoning_effort, **(body.chat_template_kwargs or {})}


def thinking_enabled(body: ChatCompletionRequest) -> bool:
    """False when chat_template_kwargs turn thinking off (Qwen3 enable_thinking, V3.1 thinking)."""
    kwargs = body.chat_template_kwargs or {}
    return kwargs.get("enable_thinking", True) is not False and kwargs.get("thinking") is not False


def reply_plan(body: ChatCompletionRequest, serving: Serving, prompt: list[int]) -> ReplyPlan:
    settings = serving.settings
    reasoning = settings.reasoning_parser
    model_family = None  # the model's own tool-call format
    if body.tools:
        model_family = resolve_tool_parser(
            settings.tool_call_parser, serving.tokenizer.chat_template
        )
    family = model_family if body.tool_choice in (None, "auto") else None
    tool = named_tool(body)
    tail = ""
    if reasoning is not None:
        tail = serving.tokenizer.decode(prompt[-8:], skip_special_tokens=False)
    return ReplyPlan(
        reasoning=reasoning,
        tool_family=family,
        forced_tool=None if tool is None else tool.function.name,
        required=bool(body.tools) and body.tool_choice == "required",
        limit=1 if body.parallel_tool_calls is False else None,
        prompt_tail=tail,
        thinking=thinking_enabled(body),
        id_family=model_family,
    )


async def guided_decoding(
    constraint: Constraint | None, serving: Serving, plan: ReplyPlan
) -> GuidedDecoding | None:
    """The request's constraint (build_constraint), checked; with a reasoning parser and
    thinking on, it applies once the reasoning has ended."""
    if constraint is None:
        return None
    if plan.reasoning is not None and plan.thinking:
        marker = end_marker(plan.reasoning)
        ids = serving.tokenizer.encode(marker, add_special_tokens=False)
        constraint = start_after(constraint, tuple(ids))
    await check_constraint(constraint, serving.settings.max_grammar_bytes)
    return constraint.guided


@dataclass(slots=True)
class ChoiceReply:
    """One choice's parser and the message its deltas fold into."""

    parser: ReplyParser
    named: bool = False  # tool_choice forced one function by name
    fold: ReplyFold = field(default_factory=ReplyFold)

    def feed(self, delta: ChoiceDelta) -> tuple[MessageDelta, str | None]:
        """The parsed delta and the choice's finish reason (see finish_reason)."""
        if self.parser.in_reasoning:
            self.fold.reasoning_tokens += len(delta.token_ids)
        parsed = self.parser.feed(delta.text)
        if delta.finish_reason is not None:
            parsed.extend(self.parser.finish())
        self.fold.add(parsed)
        return parsed, self.finish_reason(delta.finish_reason)

    def finish_reason(self, reason: str | None) -> str | None:
        """ "tool_calls" when the choice called (auto or required) and stopped by itself; a
        call forced by name ends "stop", as OpenAI answers it (and vLLM since PR #25054)."""
        called = reason == "stop" and self.fold.calls and not self.named
        return "tool_calls" if called else reason

    @staticmethod
    def delta_message(parsed: MessageDelta) -> DeltaMessage:
        # No empty content: a finish chunk is `delta: {}` as OpenAI sends it, so a streamed
        # tool-call reply accumulates to content None like the non-streamed message.
        return DeltaMessage(
            content=parsed.content or None,
            reasoning_content=parsed.reasoning or None,
            reasoning=parsed.reasoning or None,
            tool_calls=delta_tool_calls(parsed),
        )

    def message(self) -> ChatResponseMessage:
        fold = self.fold
        calls = fold.tool_calls()
        empty = not fold.content and (calls or fold.reasoning)
        return ChatResponseMessage(
            content=None if empty else fold.content,
            reasoning_content=fold.reasoning or None,
            reasoning=fold.reasoning or None,
            tool_calls=calls,
        )
