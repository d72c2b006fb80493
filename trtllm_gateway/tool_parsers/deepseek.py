"""DeepSeek V3 / R1 (and V3.1) format: calls between `<｜tool▁calls▁begin｜>` and
`<｜tool▁calls▁end｜>`, each `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` + a ```json block
(V3/R1) or `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS` (V3.1), closed by `<｜tool▁call▁end｜>`."""

from __future__ import annotations

import re

from trtllm_gateway.tool_parsers.base import ParsedCall, arguments_json
from trtllm_gateway.tool_parsers.marker import MarkerToolParser

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)
_FENCED = re.compile(r"^([^\n]+)\n```(?:json)?\s*\n(.*?)\n?```\s*$", re.S)


class DeepSeekToolParser(MarkerToolParser):
    start = (CALLS_BEGIN,)
    end = CALLS_END

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        body = block.removeprefix(CALLS_BEGIN).removesuffix(CALLS_END)
        calls: list[ParsedCall] = []
        for kind, rest in _CALL.findall(body):
            fenced = _FENCED.match(rest.strip()) if kind.strip() == "function" else None
            name, raw = (fenced.group(1), fenced.group(2)) if fenced else (kind, rest)
            args = arguments_json(raw.strip())
            if args is None or not name.strip():
                return None
            calls.append(ParsedCall(name.strip(), args))
        leftover = _CALL.sub("", body).strip()
        return calls if calls and not leftover else None
