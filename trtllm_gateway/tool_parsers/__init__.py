"""Tool-call parsers (--tool-call-parser), one module per output format, and `auto`, which
picks the format from the chat template's own tool-call syntax."""

from __future__ import annotations

from collections.abc import Callable

from trtllm_gateway.tool_parsers.base import (
    MessageDelta,
    OutputParser,
    ToolCallDelta,
    new_mistral_tool_call_id,
    new_tool_call_id,
)
from trtllm_gateway.tool_parsers.deepseek import CALLS_BEGIN, DeepSeekToolParser
from trtllm_gateway.tool_parsers.forced import NamedToolParser, RequiredToolParser
from trtllm_gateway.tool_parsers.harmony import HarmonyParser
from trtllm_gateway.tool_parsers.hermes import HermesToolParser
from trtllm_gateway.tool_parsers.llama3 import Llama3JsonToolParser
from trtllm_gateway.tool_parsers.mistral import MARKER as MISTRAL_MARKER
from trtllm_gateway.tool_parsers.mistral import MistralToolParser
from trtllm_gateway.tool_parsers.pythonic import PythonicToolParser

_FAMILIES: dict[str, Callable[[int | None], OutputParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "deepseek_v3": DeepSeekToolParser,
    "deepseek_r1": DeepSeekToolParser,
    "pythonic": PythonicToolParser,
    "harmony": HarmonyParser,
}
TOOL_CALL_PARSERS: tuple[str, ...] = (*_FAMILIES, "auto", "none")

# What a chat template writes when it renders a past tool call, most specific first.
_TEMPLATE_HINTS: tuple[tuple[str, str], ...] = (
    ("<|channel|>", "harmony"),
    (CALLS_BEGIN, "deepseek_v3"),
    (MISTRAL_MARKER, "mistral"),
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters": ', "llama3_json"),
    ("[func_name1(", "pythonic"),
)


def resolve_tool_parser(name: str, chat_template: str) -> str | None:
    """The family --tool-call-parser names; for `auto`, the one the template's syntax shows
    (None when it shows none: replies are then plain content)."""
    if name == "none":
        return None
    if name != "auto":
        return name
    return next((family for hint, family in _TEMPLATE_HINTS if hint in chat_template), None)


def create_tool_parser(family: str, limit: int | None = None) -> OutputParser:
    """`limit`: at most this many calls (parallel_tool_calls=false keeps the first)."""
    return _FAMILIES[family](limit)


def call_id_maker(family: str | None) -> Callable[[], str]:
    """The tool call ids a family's chat template accepts back: Mistral's only 9 letters and
    digits (its templates raise otherwise), everyone else OpenAI's call_..."""
    return new_mistral_tool_call_id if family == "mistral" else new_tool_call_id


def keeps_special_tokens(family: str | None) -> bool:
    """Formats whose markers are special tokens: detokenize the reply with them."""
    return family in ("harmony", "deepseek_v3", "deepseek_r1", "mistral", "llama3_json")


__all__ = [
    "TOOL_CALL_PARSERS",
    "MessageDelta",
    "NamedToolParser",
    "OutputParser",
    "RequiredToolParser",
    "ToolCallDelta",
    "call_id_maker",
    "create_tool_parser",
    "keeps_special_tokens",
    "new_tool_call_id",
    "resolve_tool_parser",
]
