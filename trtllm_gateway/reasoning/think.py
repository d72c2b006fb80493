"""`<think>...</think>` reasoning (DeepSeek-R1, Qwen3): text before the end tag is reasoning.

The reply starts in reasoning when the generation prompt already opened the block (recent R1 and
Qwen3 thinking templates write `<think>` themselves), when the reply opens it, or always for
deepseek_r1 (vLLM's rule: R1 thinks first, with or without the start tag; a start tag it writes
is dropped). A reply without any tag is content. Whitespace right after `</think>` is dropped.
"""

from __future__ import annotations

from trtllm_gateway.tool_parsers.base import MessageDelta, OutputParser, partial_suffix

START, END = "<think>", "</think>"


class ThinkParser(OutputParser):
    def __init__(self, starts_in_reasoning: bool, opened: bool) -> None:
        self._reasoning = starts_in_reasoning
        self._opened = opened  # the prompt wrote the start tag: the reply will not
        self._done = False  # the end tag is behind us: all the rest is content
        self._strip = False  # drop whitespace right after the end tag
        self._buf = ""

    @property
    def in_reasoning(self) -> bool:
        return self._reasoning

    def feed(self, text: str) -> MessageDelta:
        self._buf += text
        out = MessageDelta()
        if not self._opened:
            stripped = self._buf.lstrip()
            if START.startswith(stripped) and len(stripped) < len(START):
                return out  # could still be the start tag
            self._opened = True
            if stripped.startswith(START):
                self._buf = stripped[len(START) :]
                self._reasoning = True
        if self._reasoning:
            i = self._buf.find(END)
            if i < 0:
                split = len(self._buf) - partial_suffix(self._buf, END)
                out.reasoning, self._buf = self._buf[:split], self._buf[split:]
                return out
            out.reasoning, self._buf = self._buf[:i], self._buf[i + len(END) :]
            self._reasoning, self._done, self._strip = False, True, True
        if self._strip:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return out
            self._strip = False
        out.content, self._buf = self._buf, ""
        return out

    def finish(self) -> MessageDelta:
        rest, self._buf = self._buf, ""
        if self._reasoning:
            return MessageDelta(reasoning=rest)
        return MessageDelta(content=rest.lstrip() if self._strip else rest)
