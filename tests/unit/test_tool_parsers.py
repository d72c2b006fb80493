"""Tool-call parsers on scripted replies: every chunking gives the same message, text outside the
calls stays content, malformed calls fall back to content, limits, forced-call parsers."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from trtllm_gateway.routers.openai.chat.reply import ReplyFold, ReplyPlan
from trtllm_gateway.tool_parsers import TOOL_CALL_PARSERS, resolve_tool_parser

Parsed = tuple[str, str, list[tuple[str, Any]]]


def parse(plan: ReplyPlan, text: str, step: int) -> Parsed:
    parser, fold = plan.create(), ReplyFold()
    for i in range(0, len(text), step):
        fold.add(parser.feed(text[i : i + step]))
    fold.add(parser.finish())
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in fold.tool_calls() or ()]
    return fold.content, fold.reasoning, calls


def parse_all(plan: ReplyPlan, text: str) -> Parsed:
    results = [parse(plan, text, step) for step in (1, 2, 5, 13, max(len(text), 1))]
    assert all(r == results[0] for r in results), results
    return results[0]


W = ("get_weather", {"city": "Paris"})
T = ("get_time", {})
CASES: list[tuple[str, str, Parsed]] = [
    # hermes / qwen
    ("hermes", "Plain answer.", ("Plain answer.", "", [])),
    (
        "hermes",
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\nDone.',
        ("Checking.\nDone.", "", [W, T]),
    ),
    (  # no whitespace after the call: the space before it keeps the two sentences apart
        "hermes",
        'One. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>Two.',
        ("One. Two.", "", [T]),
    ),
    ("hermes", "a <tool_call>{oops}</tool_call> b", ("a <tool_call>{oops}</tool_call> b", "", [])),
    ("hermes", "x < y and <tool", ("x < y and <tool", "", [])),  # a marker prefix at the end
    (
        "qwen",
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n',
        ("", "", [W]),  # no closing tag (EOS), arguments as a JSON string
    ),
    # llama3 JSON
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', ("", "", [W])),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {}}',
        ("", "", [W, T]),
    ),
    ("llama3_json", '{"answer": 42}', ('{"answer": 42}', "", [])),
    ("llama3_json", "Hello {there}", ("Hello {there}", "", [])),
    # mistral
    (
        "mistral",
        'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        ("Sure.", "", [W]),
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
        ("", "", [W, T]),
    ),
    (  # v13 tokenizers (Magistral, Devstral): the model's own call id between name and args
        "mistral",
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}</s>',
        ("", "", [W]),
    ),
    ("mistral", "[TOOL_CALLS] not json", ("[TOOL_CALLS] not json", "", [])),
    # deepseek v3 / r1 / v3.1
    (
        "deepseek_v3",
        "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function'
        "<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ("Let me look.", "", [W, T]),
    ),
    (
        "deepseek_r1",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        ("", "", [W]),
    ),
    # pythonic
    ("pythonic", '[get_weather(city="Paris"), get_time()]', ("", "", [W, T])),
    ("pythonic", "[1, 2, 3]", ("[1, 2, 3]", "", [])),
    ("pythonic", "[see the docs](http://x)", ("[see the docs](http://x)", "", [])),
]


@pytest.mark.parametrize(("family", "text", "expected"), CASES)
def test_family_parses(family: str, text: str, expected: Parsed) -> None:
    assert parse_all(ReplyPlan(tool_family=family), text) == expected


def test_harmony_call_args_stream_in_pieces() -> None:
    plan = ReplyPlan(tool_family="harmony")
    parser = plan.create()
    header = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    first = parser.feed(header)
    (head,) = first.tool_calls
    assert head.name == "get_weather" and head.id and head.arguments == ""
    pieces = [parser.feed(p).tool_calls for p in ('{"city"', ': "Par', 'is"}')]
    assert [c[0].arguments for c in pieces] == ['{"city"', ': "Par', 'is"}']
    assert all(c[0].id is None and c[0].index == 0 for c in pieces)


def test_parallel_limit_keeps_first_call() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' * 3
    assert parse_all(ReplyPlan(tool_family="hermes", limit=1), text) == ("", "", [W])


def test_parallel_limit_holds_under_the_gpt_oss_reasoning_parser() -> None:
    """With --reasoning-parser gpt_oss the harmony parser reads the calls too:
    parallel_tool_calls=false must still give one call."""
    call = (
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>'
    )
    text = "<|channel|>analysis<|message|>Two calls.<|end|>" + call * 2
    for limit, calls in ((None, [W, W]), (1, [W])):
        plan = ReplyPlan(reasoning="gpt_oss", tool_family="harmony", limit=limit)
        assert parse_all(plan, text) == ("", "Two calls.", calls)


def test_forced_named_streams_arguments() -> None:
    plan = ReplyPlan(forced_tool="get_weather")
    parser = plan.create()
    first = parser.feed('{"ci')
    assert first.tool_calls[0].name == "get_weather" and first.tool_calls[0].id
    assert parser.feed('ty": "Paris"}').tool_calls[0].arguments == 'ty": "Paris"}'
    assert parse_all(plan, '{"city": "Paris"}') == ("", "", [W])


def test_forced_required_array() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", '
    plan = ReplyPlan(required=True)
    assert parse_all(plan, text + '"parameters": {}}]') == ("", "", [W, T])
    # Parameters stream as they come, the same text in any chunking.
    parser = plan.create()
    deltas = [c for ch in text for c in parser.feed(ch).tool_calls]
    assert deltas[0].name == "get_weather" and deltas[0].arguments == ""
    assert "".join(d.arguments for d in deltas if d.index == 0) == '{"city": "Paris"}'
    assert len([d for d in deltas if d.index == 0]) > 3
    # Cut short (max_tokens): the complete call is kept, the rest dropped.
    assert parse_all(plan, text)[2] == [W]
    assert parse_all(plan, "[") == ("[", "", [])


def test_ids_unique_and_indexes_in_order() -> None:
    plan = ReplyPlan(tool_family="hermes")
    parser = plan.create()
    fold = ReplyFold()
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>' * 2
    fold.add(parser.feed(text))
    fold.add(parser.finish())
    calls = fold.tool_calls() or []
    assert [c.function.name for c in calls] == ["a", "a"]
    assert len({c.id for c in calls}) == 2


def test_call_ids_are_openai_style_except_mistral_which_needs_nine_alphanumerics() -> None:
    """OpenAI ids are call_...; Mistral's templates raise on any id that is not 9 alphanumerics
    when the call comes back next turn, so its parser makes those (as vLLM's does)."""
    hermes = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    mistral = '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]'
    for family, text, pattern in (
        ("hermes", hermes, r"call_[0-9a-f]{24}"),
        ("mistral", mistral, r"[A-Za-z0-9]{9}"),
        ("mistral", "[TOOL_CALLS]a[ARGS]{}", r"[A-Za-z0-9]{9}"),
    ):
        parser, fold = ReplyPlan(tool_family=family).create(), ReplyFold()
        fold.add(parser.feed(text))
        fold.add(parser.finish())
        ids = [c.id for c in fold.tool_calls() or ()]
        assert ids and all(re.fullmatch(pattern, i) for i in ids), (family, ids)
        assert len(set(ids)) == len(ids)


def test_forced_calls_take_the_model_familys_ids() -> None:
    """A call forced by tool_choice (named or required) goes back to the same chat template next
    turn, so under a Mistral model it needs Mistral's 9-character id too."""
    for plan, text in (
        (ReplyPlan(forced_tool="get_time", id_family="mistral"), "{}"),
        (ReplyPlan(required=True, id_family="mistral"), '[{"name": "get_time", "parameters": {}}]'),
        (ReplyPlan(forced_tool="get_time", id_family="hermes"), "{}"),
    ):
        parser, fold = plan.create(), ReplyFold()
        fold.add(parser.feed(text))
        fold.add(parser.finish())
        (call,) = fold.tool_calls() or ()
        pattern = r"[A-Za-z0-9]{9}" if plan.id_family == "mistral" else r"call_[0-9a-f]{24}"
        assert re.fullmatch(pattern, call.id), (plan, call.id)


def test_resolve() -> None:
    assert resolve_tool_parser("none", "<tool_call>") is None
    assert resolve_tool_parser("mistral", "") == "mistral"
    assert resolve_tool_parser("auto", "{{ messages }}") is None  # SmolLM2-like: no tool syntax
    assert {"hermes", "harmony", "pythonic", "auto", "none"} <= set(TOOL_CALL_PARSERS)


def test_hermes_name_first_streams_arguments() -> None:
    parser = ReplyPlan(tool_family="hermes").create()
    text = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    deltas = [parser.feed(ch) for ch in text] + [parser.finish()]
    calls = [c for d in deltas for c in d.tool_calls]
    assert calls[0].name == "get_weather" and calls[0].arguments == ""
    assert "".join(c.arguments for c in calls) == '{"city": "Paris"}'
    assert len(calls) > 5  # piece by piece
    assert "".join(d.content for d in deltas) == "Hi"


def test_hermes_announced_call_keeps_its_arguments_text() -> None:
    """Once a name-first call is announced it stays a call: cut short, the arguments are what
    the model wrote (finish_reason "length" tells the client)."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'
    parser = ReplyPlan(tool_family="hermes").create()
    fold = ReplyFold()
    fold.add(parser.feed(text))
    fold.add(parser.finish())
    (call,) = fold.tool_calls() or []
    assert fold.content == ""
    assert call.function.arguments == '{"city": "Pa'
