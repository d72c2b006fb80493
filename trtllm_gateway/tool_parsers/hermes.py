"""Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks."""

from __future__ import annotations

import re

from trtllm_gateway.tool_parsers.base import ParsedCall, calls_from_json
from trtllm_gateway.tool_parsers.marker import MarkerToolParser


class HermesToolParser(MarkerToolParser):
    start = ("<tool_call>",)
    end = "</tool_call>"
    # Qwen and Hermes write the name first: its arguments can stream.
    header = re.compile(
        r'<tool_call>\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)'
    )

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        body = block.removeprefix("<tool_call>").removesuffix("</tool_call>").strip()
        calls = calls_from_json(body)
        if calls is not None:
            return calls
        # Some models put one call per line inside one block.
        lines = [line for line in body.splitlines() if line.strip()]
        parsed = [calls_from_json(line) for line in lines]
        if len(lines) > 1 and all(p is not None for p in parsed):
            return [c for p in parsed if p is not None for c in p]
        return None
