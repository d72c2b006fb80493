"""Mistral format: `[TOOL_CALLS]` then a JSON list of calls (v3 tokenizers), or
`[TOOL_CALLS]name[ARGS]{...}` per call (v11+ tokenizers; v13 puts `[CALL_ID]id` between the
name and `[ARGS]`); runs to the end of the reply."""

from __future__ import annotations

from trtllm_gateway.tool_parsers.base import (
    ParsedCall,
    arguments_json,
    calls_from_json,
    new_mistral_tool_call_id,
)
from trtllm_gateway.tool_parsers.marker import MarkerToolParser

MARKER = "[TOOL_CALLS]"


class MistralToolParser(MarkerToolParser):
    start = (MARKER,)
    new_call_id = staticmethod(new_mistral_tool_call_id)

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        calls: list[ParsedCall] = []
        for part in block.removesuffix("</s>").split(MARKER):
            part = part.strip()
            if not part:
                continue
            if "[ARGS]" in part:
                name, _, raw = part.partition("[ARGS]")
                name = name.partition("[CALL_ID]")[0]  # the model's id: ours replaces it
                args = arguments_json(raw.strip())
                if args is None or not name.strip():
                    return None
                calls.append(ParsedCall(name.strip(), args))
                continue
            parsed = calls_from_json(part)
            if parsed is None:
                return None
            calls.extend(parsed)
        return calls or None
