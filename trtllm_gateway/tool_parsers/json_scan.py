"""JsonScanner: finds where a streamed JSON object or array ends, one piece of text at a time,
so that a call's arguments can be sent as they come."""

from __future__ import annotations


class JsonScanner:
    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escape = False

    @property
    def begun(self) -> bool:
        return self._depth > 0

    def scan(self, text: str) -> tuple[int, int, bool]:
        """(begin, end, done) over `text`: text[begin:end] belongs to the value (whitespace
        before it is skipped), done when its closing bracket is text[end - 1]."""
        begin = 0
        if not self.begun:
            while begin < len(text) and text[begin].isspace():
                begin += 1
        i = begin
        while i < len(text):
            ch = text[i]
            i += 1
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return begin, i, True
        return begin, i, False
