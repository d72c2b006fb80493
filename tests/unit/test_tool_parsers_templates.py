"""Tool-call parsers against real chat templates (tests/fixtures/chat_templates/).

A model writes a tool call the way its own template renders a past one, so each template renders
a conversation whose last assistant turn holds tool calls, and the family's parser must read
that turn back: same names, same arguments, streamed in any chunking or not. `auto` must pick
the family from the template text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_tool_parsers import parse
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.chat.images import template_messages
from trtllm_gateway.routers.openai.chat.reply import ReplyPlan
from trtllm_gateway.routers.openai.schemas import ChatMessage
from trtllm_gateway.tool_parsers import resolve_tool_parser

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in a timezone.",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string", "description": "IANA zone"}},
            },
        },
    },
]
CALLS = [
    ("get_weather", {"city": "Paris", "unit": "celsius"}),
    ("get_time", {"tz": "Europe/Paris"}),
]
USER = ChatMessage(role="user", content="Weather and time in Paris?")
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<｜end▁of▁sentence｜>", "</s>")


def history(calls: list[tuple[str, dict[str, Any]]], **extra: Any) -> ChatMessage:
    """An assistant turn with tool calls as a client sends it (arguments as JSON text)."""
    return ChatMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{i:09d}abc",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for i, (name, args) in enumerate(calls)
            ],
            **extra,
        }
    )


def render(tok: Tokenizer, messages: list[ChatMessage], **kwargs: Any) -> str:
    """The conversation through the router's message shaping and the template, as text."""
    ids = tok.encode_chat(template_messages(messages, tok), tools=TOOLS, **kwargs)
    return tok.decode(ids, skip_special_tokens=False)


def template_tokenizer(tokenizer_dir: Path, name: str) -> Tokenizer:
    return Tokenizer.from_dir(tokenizer_dir, chat_template=str(TEMPLATES / name))


def rendered_reply(tok: Tokenizer, calls: list[tuple[str, dict[str, Any]]], turn: str) -> str:
    """What the template renders for the assistant turn (after its last `turn` marker)."""
    text = render(tok, [USER, history(calls)], add_generation_prompt=False)
    reply = text.rsplit(turn, 1)[1].strip()
    for marker in END_OF_TURN:
        reply = reply.removesuffix(marker).rstrip()
    return reply


def assert_parses(
    plan: ReplyPlan, text: str, calls: list[tuple[str, Any]], content: str = ""
) -> str:
    """Every chunking gives the same message, and it holds the expected calls."""
    results = [parse(plan, text, step) for step in (1, 2, 3, 7, 64, len(text))]
    assert all(r == results[0] for r in results), results
    got_content, reasoning, got_calls = results[0]
    assert got_calls == calls
    assert got_content == content
    return reasoning


IM = "<|im_start|>assistant"
LLAMA = "<|start_header_id|>assistant<|end_header_id|>"
FAMILIES = [
    ("hermes.jinja", "hermes", IM, CALLS, None),
    ("qwen3.jinja", "hermes", IM, CALLS, "qwen3"),  # history turns carry an empty think block
    ("llama3.1_json.jinja", "llama3_json", LLAMA, CALLS[:1], None),  # one call per turn
    ("mistral_parallel.jinja", "mistral", "[/INST]", CALLS, None),
    ("deepseek_v3.jinja", "deepseek_v3", "<｜Assistant｜>", CALLS, None),
    ("gpt_oss.jinja", "harmony", "<|start|>assistant", CALLS[:1], None),  # renders the first
]


@pytest.mark.parametrize(
    ("template", "family", "turn", "calls", "reasoning"), FAMILIES, ids=[f[0] for f in FAMILIES]
)
def test_template_rendered_calls_parse_back(
    tokenizer_dir: Path,
    template: str,
    family: str,
    turn: str,
    calls: list[tuple[str, Any]],
    reasoning: str | None,
) -> None:
    tok = template_tokenizer(tokenizer_dir, template)
    assert resolve_tool_parser("auto", tok.chat_template) == family
    prompt = render(tok, [USER], add_generation_prompt=True)
    assert prompt.rstrip().endswith(turn.strip())
    reply = rendered_reply(tok, calls, turn)
    assert_parses(ReplyPlan(reasoning=reasoning, tool_family=family), reply, calls)


def test_pythonic_template_and_reply(tokenizer_dir: Path) -> None:
    tok = template_tokenizer(tokenizer_dir, "llama3.2_pythonic.jinja")
    assert resolve_tool_parser("auto", tok.chat_template) == "pythonic"
    # The template prints past calls' values unquoted (city=Paris), which is no Python literal;
    # the model is prompted for Python calls, so the reply is scripted as the prompt asks.
    rendered = rendered_reply(tok, CALLS, LLAMA)
    assert rendered == "[get_weather(city=Paris, unit=celsius), get_time(tz=Europe/Paris)]"
    reply = '[get_weather(city="Paris", unit="celsius"), get_time(tz="Europe/Paris")]'
    assert_parses(ReplyPlan(tool_family="pythonic"), reply, CALLS)


def test_qwen3_reasoning_then_calls(tokenizer_dir: Path) -> None:
    tok = template_tokenizer(tokenizer_dir, "qwen3.jinja")
    turn = history(CALLS, reasoning_content="Two tools are needed.")
    head = render(tok, [USER], add_generation_prompt=True)
    reply = render(tok, [USER, turn], add_generation_prompt=False).rsplit(IM, 1)[1]
    reply = reply.removesuffix("<|im_end|>\n")
    assert reply.startswith("\n<think>\nTwo tools are needed.\n</think>")
    plan = ReplyPlan(reasoning="qwen3", tool_family="hermes", prompt_tail=head[-40:])
    reasoning = assert_parses(plan, reply, CALLS)
    assert reasoning == "\nTwo tools are needed.\n"


def test_qwen3_thinking_off_renders_closed_block(tokenizer_dir: Path) -> None:
    tok = template_tokenizer(tokenizer_dir, "qwen3.jinja")
    tail = render(tok, [USER], chat_template_kwargs={"enable_thinking": False})[-40:]
    assert tail.endswith("<think>\n\n</think>\n\n")
    plan = ReplyPlan(reasoning="qwen3", prompt_tail=tail, thinking=False)
    assert parse(plan, "Paris is sunny.", 3) == ("Paris is sunny.", "", [])


def test_gpt_oss_reasoning_answer_and_call(tokenizer_dir: Path) -> None:
    tok = template_tokenizer(tokenizer_dir, "gpt_oss.jinja")
    assert render(tok, [USER]).endswith("<|start|>assistant")
    plan = ReplyPlan(reasoning="gpt_oss", tool_family="harmony")
    answer = (
        "<|channel|>analysis<|message|>User asks weather.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."
    )
    assert parse(plan, answer, 5) == ("It is sunny in Paris.", "User asks weather.", [])
    call = (
        "<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant to=functions."
        'get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
    )
    reasoning = assert_parses(plan, call, [("get_weather", {"city": "Paris"})])
    assert reasoning == "Need the tool."


def test_history_arguments_reach_templates_as_json(tokenizer_dir: Path) -> None:
    """A past call's arguments render as JSON (not a quoted string) in a tojson template."""
    tok = template_tokenizer(tokenizer_dir, "hermes.jinja")
    text = render(tok, [USER, history(CALLS[:1])], add_generation_prompt=False)
    assert '"arguments": {"city": "Paris", "unit": "celsius"}' in text
