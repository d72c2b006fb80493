"""The render step of /v1/responses: one choice's parsed deltas (reasoning, text, tool calls) as
output items and the named events that build them, or the one response object.

Events, in the order the openai SDK's stream accumulator checks
(openai/lib/streaming/responses/_responses.py, ResponseStreamState.accumulate_event), each with a
sequence_number counting from 0:

    response.created, response.in_progress
    per item: output_item.added
              message:   content_part.added, output_text.delta..., output_text.done,
                         content_part.done
              reasoning: content_part.added, reasoning_text.delta..., reasoning_text.done,
                         content_part.done
              call:      function_call_arguments.delta..., function_call_arguments.done
              custom:    custom_tool_call_input.delta, custom_tool_call_input.done
              output_item.done
    response.completed | response.incomplete (max_output_tokens) | response.failed
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.chat.reply import ChoiceReply, ReplyPlan
from trtllm_gateway.routers.openai.choice_output import ChoiceDelta, ChoiceOutput
from trtllm_gateway.routers.openai.event_stream import Event
from trtllm_gateway.routers.openai.fanout import Item
from trtllm_gateway.routers.openai.logprobs import chat_logprobs
from trtllm_gateway.routers.openai.responses.schemas import (
    CustomToolCall,
    FunctionCall,
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    Reasoning,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
)
from trtllm_gateway.routers.openai.responses.translate import CUSTOM_INPUT
from trtllm_gateway.web.errors import error_payload


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class _Building:
    """One output item as it streams: its kind, ids and text (message, thinking or arguments)."""

    kind: str  # message | reasoning | function_call | custom_tool_call
    id: str
    output_index: int
    text: str = ""
    call_id: str = ""
    name: str = ""
    namespace: str | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    def model(self, status: str) -> OutputItem:
        if self.kind == "message":
            part = OutputText(text=self.text, logprobs=self.logprobs)
            return OutputMessage(id=self.id, status=status, content=[part])
        if self.kind == "reasoning":
            return Reasoning(id=self.id, content=[ReasoningText(text=self.text)], status=status)
        if self.kind == "custom_tool_call":
            ids = {"id": self.id, "call_id": self.call_id, "name": self.name}
            return CustomToolCall(**ids, input=custom_input(self.text), status=status)
        ids = {"id": self.id, "call_id": self.call_id, "name": self.name}
        return FunctionCall(**ids, arguments=self.text, status=status, namespace=self.namespace)

    def started(self) -> dict[str, Any]:
        """The item as output_item.added shows it: empty, in progress."""
        shown = _Building(
            self.kind, self.id, self.output_index, "", self.call_id, self.name, self.namespace
        )
        item = shown.model("in_progress").model_dump(mode="json")
        if self.kind == "message":
            item["content"] = []
        return item


def custom_input(arguments: str) -> str:
    """A custom tool's text from the arguments of the function it is served as."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return str(value[CUSTOM_INPUT])
    return arguments


class ResponsesRenderer:
    """One response's items and events; `skeleton` is the response as created (in progress)."""

    def __init__(
        self,
        skeleton: ResponseObject,
        tokenizer: Tokenizer,
        output: ChoiceOutput,
        plan: ReplyPlan,
        prompt_tokens: int,
        custom_tools: frozenset[str] = frozenset(),
        top_logprobs: int | None = None,
        namespaces: dict[str, str] | None = None,
    ) -> None:
        self.skeleton = skeleton
        self.tokenizer = tokenizer
        self.output = output
        self.prompt_tokens = prompt_tokens
        self.reply = ChoiceReply(plan.create(), plan.forced_tool is not None)
        self.custom_tools = custom_tools
        self.top_logprobs = top_logprobs  # None: no logprobs asked
        self.namespaces = namespaces or {}
        self.items: list[_Building] = []
        self.calls: dict[int, _Building] = {}  # the parser's call index -> its item
        self.sequence = 0
        self.final: ResponseObject | None = None

    def _event(self, name: str, /, **data: Any) -> Event:
        event = {"type": name, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return name, event

    def _lifecycle(self, name: str, response: BaseModel) -> Event:
        return self._event(name, response=response.model_dump(mode="json"))

    def prelude(self) -> list[Event]:
        return [
            self._lifecycle("response.created", self.skeleton),
            self._lifecycle("response.in_progress", self.skeleton),
        ]

    # --- deltas -> items ----------------------------------------------------------------------

    def events(self, delta: ChoiceDelta) -> list[Event]:
        parsed, _ = self.reply.feed(delta)
        out: list[Event] = []
        if parsed.reasoning:
            item = self._current("reasoning", out)
            item.text += parsed.reasoning
            out.append(self._delta("response.reasoning_text.delta", item, parsed.reasoning))
        if parsed.content:
            item = self._current("message", out)
            item.text += parsed.content
            logprobs = self._logprobs(delta)
            item.logprobs.extend(logprobs)
            out.append(
                self._delta("response.output_text.delta", item, parsed.content, logprobs=logprobs)
            )
        for call in parsed.tool_calls:
            if call.id is not None or call.index not in self.calls:
                self._close_open(out)
                name = call.name or ""
                kind = "custom_tool_call" if name in self.custom_tools else "function_call"
                prefix = "ctc" if kind == "custom_tool_call" else "fc"
                item = self._open(kind, prefix, call_id=call.id or new_item_id("call"))
                item.name = name
                item.namespace = self.namespaces.get(name)
                self.calls[call.index] = item
                out.append(self._event("response.output_item.added", **self._added(item)))
            item = self.calls[call.index]
            item.text += call.arguments
            if call.arguments and item.kind == "function_call":
                out.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item.id,
                        output_index=item.output_index,
                        delta=call.arguments,
                    )
                )
        return out

    def _logprobs(self, delta: ChoiceDelta) -> list[dict[str, Any]]:
        if self.top_logprobs is None:
            return []
        found = chat_logprobs(self.tokenizer, delta.logprobs, self.top_logprobs)
        return [lp.model_dump(mode="json") for lp in found]

    def _delta(self, name: str, item: _Building, text: str, **extra: Any) -> Event:
        where = {"item_id": item.id, "output_index": item.output_index, "content_index": 0}
        return self._event(name, **where, delta=text, **extra)

    def _added(self, item: _Building) -> dict[str, Any]:
        return {"output_index": item.output_index, "item": item.started()}

    def _current(self, kind: str, out: list[Event]) -> _Building:
        """The open item of `kind`, else a new one (closing the open one)."""
        if self.items and self.items[-1].kind == kind and not self.items[-1].done:
            return self.items[-1]
        self._close_open(out)
        item = self._open(kind, "msg" if kind == "message" else "rs")
        out.append(self._event("response.output_item.added", **self._added(item)))
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
        where = {"item_id": item.id, "output_index": item.output_index, "content_index": 0}
        out.append(self._event("response.content_part.added", **where, part=part))
        return item

    def _open(self, kind: str, prefix: str, call_id: str = "") -> _Building:
        item = _Building(kind, new_item_id(prefix), len(self.items), call_id=call_id)
        self.items.append(item)
        return item

    def _close_open(self, out: list[Event]) -> None:
        if self.items and not self.items[-1].done:
            out.extend(self._close(self.items[-1], "completed"))

    def _close(self, item: _Building, status: str) -> list[Event]:
        item.done = True
        model = item.model(status)
        where = {"item_id": item.id, "output_index": item.output_index}
        out: list[Event] = []
        if item.kind in ("message", "reasoning"):
            assert isinstance(model, OutputMessage | Reasoning)
            part = model.content[0].model_dump(mode="json")
            if item.kind == "message":
                done = self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=item.text,
                    logprobs=item.logprobs,
                )
            else:
                done = self._event(
                    "response.reasoning_text.done", **where, content_index=0, text=item.text
                )
            out.append(done)
            out.append(
                self._event("response.content_part.done", **where, content_index=0, part=part)
            )
        elif isinstance(model, CustomToolCall):
            out.append(
                self._event("response.custom_tool_call_input.delta", **where, delta=model.input)
            )
            out.append(
                self._event("response.custom_tool_call_input.done", **where, input=model.input)
            )
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item.name,
                    arguments=item.text,
                )
            )
        dumped = model.model_dump(mode="json")
        out.append(
            self._event("response.output_item.done", output_index=item.output_index, item=dumped)
        )
        return out

    # --- the end ------------------------------------------------------------------------------

    def epilogue(self) -> list[Event]:
        incomplete = self.output.finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        out: list[Event] = []
        if not self.items:  # an empty reply is still one (empty) message
            self._current("message", out)
        for item in self.items:
            if not item.done:
                out.extend(self._close(item, status))
        final = self.skeleton.model_copy(
            update={
                "status": status,
                "output": [i.model(status) for i in self.items],
                "usage": self.usage(),
                "completed_at": None if incomplete else int(time.time()),
                "incomplete_details": IncompleteDetails(reason="max_output_tokens")
                if incomplete
                else None,
            }
        )
        self.final = final
        name = "response.incomplete" if incomplete else "response.completed"
        out.append(self._lifecycle(name, final))
        return out

    def failed(self, exc: BaseException) -> list[Event]:
        error = error_payload(exc)["error"]
        code = str(error.get("code") or error.get("type") or "server_error")
        failed = self.skeleton.model_copy(
            update={
                "status": "failed",
                "output": [i.model("incomplete") for i in self.items],
                "error": ResponseError(code=code, message=str(error["message"])),
                "usage": self.usage(),
            }
        )
        return [self._lifecycle("response.failed", failed)]

    def usage(self) -> ResponseUsage:
        out = self.output
        prompt = out.usage.prompt_tokens if out.usage else self.prompt_tokens
        cached = out.usage.cached_tokens if out.usage else 0
        completion = out.completion_tokens
        return ResponseUsage(
            input_tokens=prompt,
            input_tokens_details=InputTokensDetails(cached_tokens=cached),
            output_tokens=completion,
            output_tokens_details=OutputTokensDetails(
                reasoning_tokens=self.reply.fold.reasoning_tokens
            ),
            total_tokens=prompt + completion,
        )

    def response(self, items: Sequence[Item]) -> ResponseObject:
        for _, delta in items:
            self.events(delta)  # the same items the stream builds; its events are dropped
        self.epilogue()
        assert self.final is not None
        return self.final
