"""Reasoning parsers (--reasoning-parser): split a reply into reasoning and content."""

from __future__ import annotations

from typing import Literal

from trtllm_gateway.reasoning.think import END, START, ThinkParser
from trtllm_gateway.tool_parsers.base import OutputParser
from trtllm_gateway.tool_parsers.harmony import HARMONY_FINAL, HarmonyParser

ReasoningParserName = Literal["deepseek_r1", "qwen3", "gpt_oss"]
REASONING_PARSERS: tuple[str, ...] = ("deepseek_r1", "qwen3", "gpt_oss")


def end_marker(name: str) -> str:
    """The text after which the answer starts (an output constraint applies from there)."""
    return HARMONY_FINAL if name == "gpt_oss" else END


def create_reasoning_parser(
    name: str, prompt_text: str, thinking: bool, limit: int | None = None
) -> OutputParser:
    """`prompt_text`: the tail of the rendered prompt (does it open a `<think>` block?);
    `thinking`: False when chat_template_kwargs turned thinking off; `limit`: the most tool
    calls kept (parallel_tool_calls=false), for gpt_oss, whose channels carry the calls too."""
    if name == "gpt_oss":
        return HarmonyParser(limit)
    opened = prompt_text.rstrip().endswith(START)
    return ThinkParser(opened or (name == "deepseek_r1" and thinking), opened)


__all__ = ["REASONING_PARSERS", "ReasoningParserName", "create_reasoning_parser", "end_marker"]
