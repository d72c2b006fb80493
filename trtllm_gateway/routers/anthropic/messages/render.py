"""The render step of /v1/messages: one choice's parsed deltas (thinking, text, tool calls) as
content blocks, streamed as Anthropic's events or folded into one message.

Events, in the order the anthropic SDK's accumulator reads them
(anthropic/lib/streaming/_messages.py, accumulate_event; "message_start" must come first):

    message_start, ping
    per block (index 0, 1, 2, ... in order):
        content_block_start
        content_block_delta...   text_delta | input_json_delta | thinking_delta, signature_delta
        content_block_stop
    message_delta (stop_reason, stop_sequence, usage), message_stop
    or, after a failure mid-stream: error
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtllm_gateway.routers.anthropic.messages.schemas import (
    ContentOut,
    MessageResponse,
    StopReason,
    TextOut,
    ThinkingOut,
    ToolUseOut,
    Usage,
)
from trtllm_gateway.routers.openai.chat.reply import ChoiceReply, ReplyPlan
from trtllm_gateway.routers.openai.choice_output import ChoiceDelta, ChoiceOutput
from trtllm_gateway.routers.openai.event_stream import Event
from trtllm_gateway.routers.openai.fanout import Item
from trtllm_gateway.web.errors import anthropic_error


@dataclass(slots=True)
class _Block:
    kind: str  # text | thinking | tool_use
    index: int
    text: str = ""  # the text, the thinking, or the tool's input JSON
    id: str = ""
    name: str = ""
    done: bool = False

    def model(self) -> ContentOut:
        if self.kind == "text":
            return TextOut(text=self.text)
        if self.kind == "thinking":
            return ThinkingOut(thinking=self.text, signature=signature(self.text))
        return ToolUseOut(id=self.id, name=self.name, input=tool_input(self.text))

    def started(self) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": ""}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": "", "signature": ""}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": {}}


def signature(thinking: str) -> str:
    """The thinking block's signature: a digest of its text (clients send it back as given)."""
    return hashlib.sha256(thinking.encode()).hexdigest()


def tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessagesRenderer:
    def __init__(
        self,
        message_id: str,
        model: str,
        output: ChoiceOutput,
        plan: ReplyPlan,
        prompt_tokens: int,
    ) -> None:
        self.message_id = message_id
        self.model = model
        self.output = output
        self.prompt_tokens = prompt_tokens
        self.reply = ChoiceReply(plan.create(), plan.forced_tool is not None)
        self.blocks: list[_Block] = []
        self.calls: dict[int, _Block] = {}

    def prelude(self) -> list[Event]:
        message = self._message(
            [], None, None, Usage(input_tokens=self.prompt_tokens, output_tokens=0)
        )
        return [
            (
                "message_start",
                {"type": "message_start", "message": message.model_dump(mode="json")},
            ),
            ("ping", {"type": "ping"}),
        ]

    def events(self, delta: ChoiceDelta) -> list[Event]:
        parsed, _ = self.reply.feed(delta)
        out: list[Event] = []
        if parsed.reasoning:
            block = self._current("thinking", out)
            block.text += parsed.reasoning
            out.append(self._delta(block, {"type": "thinking_delta", "thinking": parsed.reasoning}))
        if parsed.content:
            block = self._current("text", out)
            block.text += parsed.content
            out.append(self._delta(block, {"type": "text_delta", "text": parsed.content}))
        for call in parsed.tool_calls:
            if call.id is not None or call.index not in self.calls:
                self._close_open(out)
                block = _Block("tool_use", len(self.blocks), id=call.id or "", name=call.name or "")
                self.blocks.append(block)
                self.calls[call.index] = block
                out.append(self._start(block))
            block = self.calls[call.index]
            block.text += call.arguments
            if call.arguments:
                out.append(
                    self._delta(block, {"type": "input_json_delta", "partial_json": call.arguments})
                )
        return out

    def _start(self, block: _Block) -> Event:
        data = {
            "type": "content_block_start",
            "index": block.index,
            "content_block": block.started(),
        }
        return "content_block_start", data

    def _delta(self, block: _Block, delta: dict[str, Any]) -> Event:
        data = {"type": "content_block_delta", "index": block.index, "delta": delta}
        return "content_block_delta", data

    def _current(self, kind: str, out: list[Event]) -> _Block:
        if self.blocks and self.blocks[-1].kind == kind and not self.blocks[-1].done:
            return self.blocks[-1]
        self._close_open(out)
        block = _Block(kind, len(self.blocks))
        self.blocks.append(block)
        out.append(self._start(block))
        return block

    def _close_open(self, out: list[Event]) -> None:
        if not self.blocks or self.blocks[-1].done:
            return
        block = self.blocks[-1]
        block.done = True
        if block.kind == "thinking":
            out.append(
                self._delta(block, {"type": "signature_delta", "signature": signature(block.text)})
            )
        out.append(("content_block_stop", {"type": "content_block_stop", "index": block.index}))

    def stop(self) -> tuple[StopReason, str | None]:
        output = self.output
        if output.finish_reason == "length":
            return "max_tokens", None
        if isinstance(output.stop_reason, str):
            return "stop_sequence", output.stop_reason
        if any(b.kind == "tool_use" for b in self.blocks):
            return "tool_use", None
        return "end_turn", None

    def usage(self) -> Usage:
        out = self.output
        prompt = out.usage.prompt_tokens if out.usage else self.prompt_tokens
        cached = out.usage.cached_tokens if out.usage else 0
        return Usage(
            input_tokens=prompt - cached,
            output_tokens=out.completion_tokens,
            cache_read_input_tokens=cached,
        )

    def epilogue(self) -> list[Event]:
        out: list[Event] = []
        self._close_open(out)
        reason, sequence = self.stop()
        usage = self.usage()
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        out.append(
            (
                "message_delta",
                {"type": "message_delta", "delta": delta, "usage": usage.model_dump()},
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def failed(self, exc: BaseException) -> list[Event]:
        _, body = anthropic_error(exc)
        return [("error", body)]

    def _message(
        self,
        content: list[ContentOut],
        reason: StopReason | None,
        sequence: str | None,
        usage: Usage,
    ) -> MessageResponse:
        return MessageResponse(
            id=self.message_id,
            model=self.model,
            content=content,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=usage,
        )

    def response(self, items: Sequence[Item]) -> MessageResponse:
        for _, delta in items:
            self.events(delta)  # the same blocks the stream builds; its events are dropped
        self._close_open([])
        reason, sequence = self.stop()
        return self._message([b.model() for b in self.blocks], reason, sequence, self.usage())
