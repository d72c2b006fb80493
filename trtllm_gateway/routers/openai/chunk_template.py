"""TextChunk: the streaming chunk of one choice whose only varying part is its text, pre-rendered.

Mid-stream chunks of a choice differ only in their text. Dumping a pydantic chunk per token costs
a validation and a serialization; the template dumps the chunk once with a marker in the text
field, splits the JSON around it, and then renders a token as the JSON string of its text between
the two halves: the same bytes as `model_dump_json()` (tests/unit/test_chunk_template.py).
"""

from __future__ import annotations

import json

from pydantic import BaseModel

_MARKER = "\x00text\x00"


def json_string(text: str) -> bytes:
    """A JSON string as pydantic writes it: UTF-8, only quote, backslash and controls escaped."""
    return json.dumps(text, ensure_ascii=False).encode()


class TextChunk:
    def __init__(self, chunk: BaseModel) -> None:
        """`chunk`: the model as it would be sent, with the marker text in the varying field."""
        dumped = chunk.model_dump_json().encode()
        head, found, tail = dumped.partition(json_string(_MARKER))
        if not found or json_string(_MARKER) in tail:
            raise ValueError("the chunk must carry the marker exactly once")
        self._head = head
        self._tail = tail

    @staticmethod
    def marker() -> str:
        return _MARKER

    def render(self, text: str) -> bytes:
        """The chunk's JSON with `text` in place of the marker."""
        return self._head + json_string(text) + self._tail
