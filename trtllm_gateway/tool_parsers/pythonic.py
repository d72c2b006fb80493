"""Pythonic format (Llama 3.2 / Llama 4 / Gemma pythonic templates): the reply is a Python list
of calls, `[get_weather(city="Paris"), get_time(tz="CET")]`, keyword arguments as literals."""

from __future__ import annotations

import ast
import json

from trtllm_gateway.tool_parsers.base import ParsedCall
from trtllm_gateway.tool_parsers.marker import MarkerToolParser

START, END = "<|python_start|>", "<|python_end|>"


class PythonicToolParser(MarkerToolParser):
    start = (START, "[")
    at_start_only = True

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        text = block.strip().removeprefix(START).strip().removesuffix(END).strip()
        text = text.removesuffix("<|eot_id|>").removesuffix("<|eom|>").strip()
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError:
            return None
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls: list[ParsedCall] = []
        for node in tree.elts:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
                return None
            try:
                args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
                text_args = json.dumps(args, ensure_ascii=False)
            except (ValueError, TypeError):
                return None
            calls.append(ParsedCall(node.func.id, text_args))
        return calls
