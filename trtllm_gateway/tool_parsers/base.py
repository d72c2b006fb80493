"""What every output parser emits (content, reasoning, tool-call deltas) and the pieces the
parsers share (call numbering, JSON argument checks, the OutputParser interface).

A parser is fed the choice's text deltas and returns MessageDelta pieces; `finish()` flushes
what it held back. The non-streamed message is the fold of the same pieces, so the streamed
deltas always reassemble exactly to it. Whitespace next to a call is dropped (content is null
when nothing else is left), except that text on both sides of the calls keeps one run of it
between them; see marker.py for when a call is announced and when a block that
does not parse falls back to content.
"""

from __future__ import annotations

import json
import secrets
import string
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def new_mistral_tool_call_id() -> str:
    """Mistral's chat templates refuse any id that is not 9 alphanumerics ("Tool call IDs should
    be alphanumeric strings with length 9!"), so a call sent back next turn must have one (as
    vLLM's mistral parser makes them)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of one call: the first piece of a call carries id and name, later ones only
    argument text (OpenAI's delta.tool_calls[] entries)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class MessageDelta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.content and not self.reasoning and not self.tool_calls

    def extend(self, other: MessageDelta) -> MessageDelta:
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_calls.extend(other.tool_calls)
        return self


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


def arguments_json(value: Any) -> str | None:
    """A call's arguments as JSON text: a dict as is, a JSON string of a dict decoded first."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def call_from_object(
    obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")
) -> ParsedCall | None:
    """{"name": ..., "arguments"|"parameters": {...}} -> ParsedCall (missing arguments: {})."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    raw: Any = next((obj[k] for k in args_keys if k in obj), {})
    args = arguments_json(raw)
    return None if args is None else ParsedCall(obj["name"], args)


def calls_from_json(text: str) -> list[ParsedCall] | None:
    """One call object or a list of them as JSON text; None unless every entry is a call."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


class OutputParser(ABC):
    """Streaming interface shared by tool and reasoning parsers."""

    @abstractmethod
    def feed(self, text: str) -> MessageDelta: ...

    @abstractmethod
    def finish(self) -> MessageDelta: ...

    @property
    def in_reasoning(self) -> bool:
        return False


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ToolCallEmitter:
    """Numbers the calls of one choice and turns them into deltas; keeps at most `limit`."""

    def __init__(
        self, limit: int | None = None, new_id: Callable[[], str] = new_tool_call_id
    ) -> None:
        self.count = 0
        self._limit = limit
        self._new_id = new_id

    def emit(self, calls: list[ParsedCall]) -> list[ToolCallDelta]:
        out = []
        for call in calls:
            if self._limit is not None and self.count >= self._limit:
                break
            out.append(ToolCallDelta(self.count, self._new_id(), call.name, call.arguments))
            self.count += 1
        return out
