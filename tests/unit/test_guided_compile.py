"""engine.guided.check_guided / grammar_for: validation, param naming, limits, the cache."""

from __future__ import annotations

import json

import pytest

from trtllm_gateway.engine.guided import check_guided, grammar_for
from trtllm_gateway.engine.guided import compile as guided_compile
from trtllm_gateway.engine.protocol import GuidedDecoding, InvalidRequestError

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array"}},
        "required": ["name"],
    }
)


@pytest.mark.parametrize(
    "guided",
    [
        GuidedDecoding("json", SCHEMA),
        GuidedDecoding("json_object"),
        GuidedDecoding("regex", r"(yes|no)\d{2}"),
        GuidedDecoding("grammar", 'start: "a" b\nb: "b"+'),
    ],
)
def test_valid_constraints_pass(guided: GuidedDecoding) -> None:
    check_guided(guided, 10_000)
    assert grammar_for(guided)  # an llguidance grammar (JSON, or Lark text as given)


@pytest.mark.parametrize(
    ("guided", "param", "words"),
    [
        (GuidedDecoding("json", "{not json"), "response_format.json_schema.schema", "JSON"),
        (
            GuidedDecoding("json", '{"type": "object", "properties": {"a": {"type": "strin"}}}'),
            "response_format.json_schema.schema",
            "strin",
        ),
        (GuidedDecoding("regex", "[a-z"), "structured_outputs.regex", "unclosed"),
        (GuidedDecoding("grammar", "start: foo"), "structured_outputs.grammar", "foo"),
    ],
)
def test_invalid_constraints_name_the_param(guided: GuidedDecoding, param: str, words: str) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        check_guided(guided, 10_000)
    assert exc.value.param == param
    assert words in str(exc.value)


def test_explicit_param_wins() -> None:
    with pytest.raises(InvalidRequestError) as exc:
        check_guided(GuidedDecoding("regex", "("), 100, param="tool_choice")
    assert exc.value.param == "tool_choice"


def test_size_limit() -> None:
    with pytest.raises(InvalidRequestError, match="limit of 10") as exc:
        check_guided(GuidedDecoding("regex", "a" * 11), 10)
    assert exc.value.param == "structured_outputs.regex"
    check_guided(GuidedDecoding("regex", "a" * 11), 0)  # 0: no limit


def test_negative_start_after_refused() -> None:
    with pytest.raises(InvalidRequestError, match="start_after"):
        check_guided(GuidedDecoding("regex", "a", start_after=(-1,)), 100)


def test_compiled_once_per_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = guided_compile._compile

    def counting(guided: GuidedDecoding, param: str) -> str:
        calls.append(guided.spec)
        return real(guided, param)

    monkeypatch.setattr(guided_compile, "_compile", counting)
    spec = r"cache-test-\d+"
    first = grammar_for(GuidedDecoding("regex", spec))
    assert grammar_for(GuidedDecoding("regex", spec, start_after=(5,))) == first
    assert calls == [spec]
