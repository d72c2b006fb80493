"""Replies constrained to a tool call (tool_choice "required" or a named function): the output
is JSON of the call schema, so it turns into tool_calls directly, no format parser needed.

Named function: the output is the arguments object itself; it streams as argument fragments
behind a first delta carrying the id and name. Required: the output is a JSON array of
{"name", "parameters"} objects; a call is announced once its name is complete and its
parameters stream after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from trtllm_gateway.tool_parsers.base import (
    MessageDelta,
    OutputParser,
    ParsedCall,
    ToolCallDelta,
    ToolCallEmitter,
    call_from_object,
    new_tool_call_id,
)
from trtllm_gateway.tool_parsers.json_scan import JsonScanner


class NamedToolParser(OutputParser):
    def __init__(self, name: str, new_id: Callable[[], str] = new_tool_call_id) -> None:
        self._name = name
        self._started = False
        self._emitter = ToolCallEmitter(new_id=new_id)

    def feed(self, text: str) -> MessageDelta:
        if not text:
            return MessageDelta()
        if not self._started:
            self._started = True
            head = self._emitter.emit([ParsedCall(self._name, text.lstrip())])
            return MessageDelta(tool_calls=head)
        return MessageDelta(tool_calls=[ToolCallDelta(0, arguments=text)])

    def finish(self) -> MessageDelta:
        if self._started:
            return MessageDelta()
        self._started = True  # an empty reply still names the call, with no arguments
        return MessageDelta(tool_calls=self._emitter.emit([ParsedCall(self._name, "")]))


_HEADER = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"parameters"\s*:\s*')


class RequiredToolParser(OutputParser):
    """[{"name": ..., "parameters": {...}}, ...]: each call is announced once its name is known,
    and its parameters stream as they come (the grammar guarantees they are valid JSON)."""

    def __init__(
        self, limit: int | None = None, new_id: Callable[[], str] = new_tool_call_id
    ) -> None:
        self._emitter = ToolCallEmitter(limit, new_id)
        self._buf = ""
        self._pos = 0  # next unread character
        self._index: int | None = None  # the call whose parameters are streaming
        self._scanner = JsonScanner()
        self._decoder = json.JSONDecoder()

    def feed(self, text: str) -> MessageDelta:
        self._buf += text
        out = MessageDelta()
        while self._step(out):
            pass
        return out

    def finish(self) -> MessageDelta:
        out = self.feed("")
        if not self._emitter.count:
            # Not a call list after all (e.g. cut by max_tokens): show the text as content.
            out.content = self._buf
        return out

    def _step(self, out: MessageDelta) -> bool:
        if self._index is not None:
            return self._stream_parameters(out)
        while self._pos < len(self._buf) and self._buf[self._pos] in " \t\r\n[,}":
            self._pos += 1  # between calls, or the end of the call whose parameters ended
        if self._pos >= len(self._buf) or self._buf[self._pos] == "]":
            return False
        header = _HEADER.match(self._buf, self._pos)
        if header is not None:
            name = json.loads(f'"{header.group(1)}"')
            calls = self._emitter.emit([ParsedCall(name, "")])
            self._index = calls[0].index if calls else -1  # -1: past the limit, not shown
            out.tool_calls.extend(calls)
            self._pos = header.end()
            self._scanner = JsonScanner()
            return True
        try:  # another key order: take the object once it is complete
            obj, end = self._decoder.raw_decode(self._buf, self._pos)
        except ValueError:
            return False
        self._pos = end
        call = call_from_object(obj, ("parameters", "arguments"))
        if call is not None:
            out.tool_calls.extend(self._emitter.emit([call]))
        return True

    def _stream_parameters(self, out: MessageDelta) -> bool:
        begin, end, done = self._scanner.scan(self._buf[self._pos :])
        piece = self._buf[self._pos + begin : self._pos + end]
        self._pos += end
        if self._index is not None and self._index >= 0 and piece:
            out.tool_calls.append(ToolCallDelta(self._index, arguments=piece))
        if done:
            self._index = None
        return done
