"""gpt-oss harmony format: reasoning, answer and tool calls as channels of one reply.

After the generation prompt `<|start|>assistant` the model writes messages
`<|channel|>analysis<|message|>...<|end|>` (reasoning), `<|channel|>final<|message|>...<|return|>`
(content) and `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`
(a tool call), later ones after `<|start|>assistant`. The markers are special tokens, so the
choice is detokenized with them (keeps_special_tokens). Parsed on text: the openai-harmony
package's load_harmony_encoding downloads its vocab file at run time (openai/harmony#46, #95),
which a server without network cannot do. A tool call's arguments stream as they come.
"""

from __future__ import annotations

import re

from trtllm_gateway.tool_parsers.base import (
    MessageDelta,
    OutputParser,
    ParsedCall,
    ToolCallDelta,
    ToolCallEmitter,
    partial_suffix,
)

MESSAGE = "<|message|>"
HARMONY_FINAL = "<|channel|>final<|message|>"  # where the answer starts
_TERMINATORS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_MARKER = re.compile(r"<\|[a-z_]+\|>")


class HarmonyParser(OutputParser):
    keeps_special_tokens = True

    def __init__(self, limit: int | None = None) -> None:
        self._emitter = ToolCallEmitter(limit)
        self._buf = ""
        self._target: str | None = None  # None: in a header; "reasoning" | "content" | "call"
        self._call_index = -1

    @property
    def in_reasoning(self) -> bool:
        return self._target in (None, "reasoning")

    def feed(self, text: str) -> MessageDelta:
        self._buf += text
        out = MessageDelta()
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> MessageDelta:
        out = MessageDelta()
        while self._step(out, final=True):
            pass
        if self._target is None and self._buf:
            # No message marker at all: a reply that is not in harmony format is content.
            out.content += _MARKER.sub("", self._buf).strip()
        self._buf = ""
        return out

    def _step(self, out: MessageDelta, final: bool) -> bool:
        if self._target is None:
            i = self._buf.find(MESSAGE)
            if i < 0:
                return False
            self._open(out, self._buf[:i])
            self._buf = self._buf[i + len(MESSAGE) :]
            return True
        hits = [(i, t) for t in _TERMINATORS if (i := self._buf.find(t)) >= 0]
        if hits:
            i, marker = min(hits)
            self._body(out, self._buf[:i])
            # `<|start|>` opens the next header: keep it there; other terminators are dropped.
            self._buf = self._buf[i:] if marker == "<|start|>" else self._buf[i + len(marker) :]
            self._target = None
            return True
        held = 0 if final else max(partial_suffix(self._buf, t) for t in _TERMINATORS)
        self._body(out, self._buf[: len(self._buf) - held])
        self._buf = self._buf[len(self._buf) - held :]
        return False

    def _open(self, out: MessageDelta, header: str) -> None:
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient and recipient.group(1).startswith("functions."):
            name = recipient.group(1).removeprefix("functions.")
            calls = self._emitter.emit([ParsedCall(name, "")])  # arguments stream after
            self._call_index = calls[0].index if calls else -1
            out.tool_calls.extend(calls)
            self._target = "call"
        elif channel and channel.group(1) == "analysis":
            self._target = "reasoning"
        else:
            self._target = "content"

    def _body(self, out: MessageDelta, text: str) -> None:
        if not text:
            return
        if self._target == "reasoning":
            out.reasoning += text
        elif self._target == "content":
            out.content += text
        elif self._call_index >= 0:
            out.tool_calls.append(ToolCallDelta(self._call_index, arguments=text))
