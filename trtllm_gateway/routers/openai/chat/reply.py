"""One choice's reply split into reasoning, content and tool calls, streamed and folded.

ReplyPlan is decided once per request (which reasoning parser, which tool-call format, or a
forced call); each choice gets a ReplyParser that chains them: the reasoning parser first, its
content into the tool parser. ReplyFold accumulates the same deltas into the final message, so
a non-streamed reply is exactly the concatenation of the streamed one. ChoiceReply holds one
choice's parser and fold, and shapes what they give as the chat wire's deltas and message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_gateway.reasoning import create_reasoning_parser
from trtllm_gateway.routers.openai.choice_output import ChoiceDelta
from trtllm_gateway.routers.openai.schemas import (
    ChatResponseMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from trtllm_gateway.tool_parsers import (
    MessageDelta,
    NamedToolParser,
    OutputParser,
    RequiredToolParser,
    call_id_maker,
    create_tool_parser,
    keeps_special_tokens,
)


@dataclass(frozen=True, slots=True)
class ReplyPlan:
    reasoning: str | None = None  # --reasoning-parser, when thinking is on
    tool_family: str | None = None  # tool_choice auto with a known format
    forced_tool: str | None = None  # the named function tool_choice forces
    required: bool = False  # tool_choice "required"
    limit: int | None = None  # 1 with parallel_tool_calls=false
    prompt_tail: str = ""  # the end of the rendered prompt (an open <think>?)
    thinking: bool = True
    id_family: str | None = None  # the model's tool-call format: whose call ids (forced calls)

    @property
    def active(self) -> bool:
        return bool(self.reasoning or self.tool_family or self.forced_tool or self.required)

    @property
    def keeps_special_tokens(self) -> bool:
        """Detokenize with special tokens when a format's markers are special tokens."""
        family = "harmony" if self.reasoning == "gpt_oss" else self.tool_family
        return keeps_special_tokens(family)

    def create(self) -> ReplyParser:
        reasoning = None
        if self.reasoning is not None:
            reasoning = create_reasoning_parser(
                self.reasoning, self.prompt_tail, self.thinking, self.limit
            )
        tools: OutputParser | None = None
        new_id = call_id_maker(self.id_family)
        if self.forced_tool is not None:
            tools = NamedToolParser(self.forced_tool, new_id)
        elif self.required:
            tools = RequiredToolParser(self.limit, new_id)
        elif self.tool_family is not None and not (
            self.reasoning == "gpt_oss" and self.tool_family == "harmony"
        ):
            tools = create_tool_parser(self.tool_family, self.limit)
        return ReplyParser(reasoning, tools)


class ReplyParser:
    def __init__(self, reasoning: OutputParser | None, tools: OutputParser | None) -> None:
        self._reasoning = reasoning
        self._tools = tools

    @property
    def in_reasoning(self) -> bool:
        return self._reasoning is not None and self._reasoning.in_reasoning

    def feed(self, text: str) -> MessageDelta:
        if self._reasoning is None:
            return self._content(MessageDelta(content=text))
        return self._content(self._reasoning.feed(text))

    def finish(self) -> MessageDelta:
        out = self._content(self._reasoning.finish()) if self._reasoning else MessageDelta()
        if self._tools is not None:
            out.extend(self._tools.finish())
        return out

    def _content(self, delta: MessageDelta) -> MessageDelta:
        """Route the content part through the tool parser."""
        if self._tools is None or not delta.content:
            return delta
        parsed = self._tools.feed(delta.content)
        parsed.reasoning = delta.reasoning + parsed.reasoning
        parsed.tool_calls[:0] = delta.tool_calls
        return parsed


def delta_tool_calls(delta: MessageDelta) -> list[DeltaToolCall] | None:
    if not delta.tool_calls:
        return None
    return [
        DeltaToolCall(
            index=c.index,
            id=c.id,
            type="function" if c.id is not None else None,
            function=DeltaFunctionCall(name=c.name, arguments=c.arguments),
        )
        for c in delta.tool_calls
    ]


@dataclass(slots=True)
class ReplyFold:
    """The final message of one choice: the deltas, concatenated."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments]
    reasoning_tokens: int = 0

    def add(self, delta: MessageDelta) -> None:
        self.content += delta.content
        self.reasoning += delta.reasoning
        for c in delta.tool_calls:
            entry = self.calls.setdefault(c.index, ["", "", ""])
            if c.id is not None:
                entry[0], entry[1] = c.id, c.name or ""
            entry[2] += c.arguments

    def tool_calls(self) -> list[ToolCall] | None:
        if not self.calls:
            return None
        return [
            ToolCall(id=i, function=FunctionCall(name=name, arguments=args))
            for i, name, args in (self.calls[k] for k in sorted(self.calls))
        ]


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
