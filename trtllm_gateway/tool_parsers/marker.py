"""MarkerToolParser: tool calls in marked blocks of the reply, the shape most families share."""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Callable

from trtllm_gateway.tool_parsers.base import (
    MessageDelta,
    OutputParser,
    ParsedCall,
    ToolCallDelta,
    ToolCallEmitter,
    new_tool_call_id,
    partial_suffix,
)
from trtllm_gateway.tool_parsers.json_scan import JsonScanner


class MarkerToolParser(OutputParser):
    """Calls in blocks between a start marker and an end marker (or the end of the output).

    Subclasses set `start` and `end` (None: the block runs to the end of the output) and parse
    a block's text (markers included) into calls, or None when it is not a valid call block.
    With `at_start_only`, a block may begin only at the start of the output (JSON or pythonic
    formats, where the start "marker" is the block's first character).

    With a `header` pattern (group 1: the JSON-escaped name) that matches the open block's
    start, the call is announced at once and its arguments object streams as it comes; the
    block is then a call even if what follows does not parse (as vLLM streams them). A block
    whose header does not match waits for its end and falls back to content if it does not
    parse.
    """

    start: tuple[str, ...] = ()
    end: str | None = None
    at_start_only: bool = False
    header: re.Pattern[str] | None = None
    new_call_id: Callable[[], str] = staticmethod(new_tool_call_id)

    def __init__(self, limit: int | None = None) -> None:
        self._emitter = ToolCallEmitter(limit, self.new_call_id)
        self._buf = ""  # unparsed text: held content, or an open block
        self._in_block = False
        self._seen_text = False  # any non-whitespace output so far (at_start_only)
        self._after_block = False  # drop whitespace right after a call
        self._gap = ""  # whitespace before the open block
        self._dropped = ""  # whitespace dropped after the last call, so far
        self._said = False  # any content out so far
        self._streaming: tuple[int, JsonScanner] | None = None  # (call index, its arguments)
        self._args_done = False

    @abstractmethod
    def parse_block(self, block: str) -> list[ParsedCall] | None: ...

    def feed(self, text: str) -> MessageDelta:
        self._buf += text
        out = MessageDelta()
        while True:
            if self._in_block:
                if not self._in_open_block(out, final=False):
                    return out
            elif not self._open_block(out, final=False):
                return out

    def finish(self) -> MessageDelta:
        out = MessageDelta()
        while self._buf or self._streaming:
            if self._in_block:
                self._in_open_block(out, final=True)
            else:
                self._open_block(out, final=True)
        return out

    def _content(self, out: MessageDelta, text: str) -> None:
        if self._after_block:
            stripped = text.lstrip()
            self._dropped += text[: len(text) - len(stripped)]
            if not stripped:
                return
            if self._said:  # text on both sides of the calls stays apart ("a.\nb.", not "a.b.")
                stripped = (self._dropped or self._gap) + stripped
            text, self._after_block, self._dropped = stripped, False, ""
        self._said = self._said or bool(text)
        out.content += text

    def _find_start(self) -> tuple[int, str] | None:
        if self.at_start_only:
            if self._seen_text:
                return None
            stripped = self._buf.lstrip()
            for marker in self.start:
                if stripped.startswith(marker):
                    return len(self._buf) - len(stripped), marker
            return None
        found = [(self._buf.find(m), m) for m in self.start]
        hits = [(i, m) for i, m in found if i >= 0]
        return min(hits) if hits else None

    def _open_block(self, out: MessageDelta, final: bool) -> bool:
        """Content up to a start marker; True when a block opened (keep going)."""
        hit = self._find_start()
        if hit is not None:
            i, _ = hit
            # Whitespace between text and a call belongs to neither (kept if it is no call).
            before = self._buf[:i].rstrip()
            self._content(out, before)
            self._gap, self._buf = self._buf[len(before) : i], self._buf[i:]
            self._in_block = True
            self._seen_text = True
            return True
        if final:
            rest = self._buf if not self._emitter.count else self._buf.rstrip()
            self._content(out, rest)
            self._buf = ""
            return False
        if self.at_start_only and not self._seen_text:
            stripped = self._buf.lstrip()
            if not stripped or any(m.startswith(stripped) for m in self.start):
                return False  # still undecided
            self._seen_text = True
        # Hold back what could start a marker, and trailing whitespace (it may precede a call).
        held = max((partial_suffix(self._buf, m) for m in self.start), default=0)
        safe = self._buf[: len(self._buf) - held]
        keep = len(safe) - len(safe.rstrip())
        emit = safe[: len(safe) - keep]
        self._content(out, emit)
        self._buf = self._buf[len(emit) :]
        return False

    def _in_open_block(self, out: MessageDelta, final: bool) -> bool:
        if self._streaming is None and self.header is not None:
            match = self.header.match(self._buf)
            if match is not None:
                name = json.loads(f'"{match.group(1)}"')
                calls = self._emitter.emit([ParsedCall(name, "")])
                out.tool_calls.extend(calls)
                self._streaming = (calls[0].index if calls else -1, JsonScanner())
                self._args_done = False
                self._buf = self._buf[match.end() :]
        if self._streaming is not None:
            return self._stream_arguments(out, final)
        return self._close_block(out, final)

    def _stream_arguments(self, out: MessageDelta, final: bool) -> bool:
        """Arguments text as it comes; then skip to the block's end. True when it closed."""
        assert self._streaming is not None
        index, scanner = self._streaming
        if not self._args_done:
            begin, end, self._args_done = scanner.scan(self._buf)
            if index >= 0 and end > begin:
                out.tool_calls.append(ToolCallDelta(index, arguments=self._buf[begin:end]))
            self._buf = self._buf[end:]
        j = self._buf.find(self.end) if self.end is not None else -1
        if j < 0 and not final:
            return False
        self._buf = self._buf[j + len(self.end) :] if j >= 0 and self.end is not None else ""
        self._streaming, self._in_block, self._after_block = None, False, True
        return True

    def _close_block(self, out: MessageDelta, final: bool) -> bool:
        """A complete block -> calls (or content when it does not parse); True when closed."""
        if self.end is not None:
            j = self._buf.find(self.end, 1)
            if j >= 0:
                block, self._buf = self._buf[: j + len(self.end)], self._buf[j + len(self.end) :]
                self._finish_block(out, block)
                return True
        if not final:
            return False
        block, self._buf = self._buf, ""
        self._finish_block(out, block)
        return True

    def _finish_block(self, out: MessageDelta, block: str) -> None:
        self._in_block = False
        calls = self.parse_block(block)
        if calls is None:
            self._content(out, self._gap + block)
            return
        out.tool_calls.extend(self._emitter.emit(calls))
        self._after_block = True
