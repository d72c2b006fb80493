"""Llama 3.1/3.2 JSON format: the whole reply is `{"name": ..., "parameters": {...}}` (optionally
after `<|python_tag|>`), several calls separated by `;`."""

from __future__ import annotations

import json

from trtllm_gateway.tool_parsers.base import ParsedCall, call_from_object
from trtllm_gateway.tool_parsers.marker import MarkerToolParser

_TRAILING = ("<|eom_id|>", "<|eot_id|>")


class Llama3JsonToolParser(MarkerToolParser):
    start = ("<|python_tag|>", "{")
    at_start_only = True

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        text = block.strip().removeprefix("<|python_tag|>")
        for tail in _TRAILING:
            text = text.strip().removesuffix(tail)
        decoder = json.JSONDecoder()
        calls: list[ParsedCall] = []
        pos, text = 0, text.strip()
        while pos < len(text):
            try:
                obj, pos = decoder.raw_decode(text, pos)
            except ValueError:
                return None
            call = call_from_object(obj, ("parameters", "arguments"))
            if call is None:
                return None
            calls.append(call)
            while pos < len(text) and text[pos] in " \t\r\n;":
                pos += 1
        return calls or None
