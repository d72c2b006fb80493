"""Reasoning parsers on scripted replies: where reasoning starts and ends, in any chunking."""

from __future__ import annotations

import pytest

from trtllm_gateway.reasoning import create_reasoning_parser, end_marker
from trtllm_gateway.routers.openai.chat.reply import ReplyFold

Split = tuple[str, str]  # (reasoning, content)


def split(name: str, text: str, prompt_tail: str = "", thinking: bool = True) -> Split:
    results = []
    for step in (1, 2, 3, 8, max(len(text), 1)):
        parser, fold = create_reasoning_parser(name, prompt_tail, thinking), ReplyFold()
        for i in range(0, len(text), step):
            fold.add(parser.feed(text[i : i + step]))
        fold.add(parser.finish())
        results.append((fold.reasoning, fold.content))
    assert all(r == results[0] for r in results), results
    return results[0]


CASES = [
    ("qwen3", "<think>a</think>b", "", True, ("a", "b")),
    ("qwen3", "<think>\nplan\n</think>\n\nanswer", "", True, ("\nplan\n", "answer")),
    ("qwen3", "no thinking", "", True, ("", "no thinking")),
    ("qwen3", "<thin", "", True, ("", "<thin")),  # a start-tag prefix that never completes
    ("qwen3", "  <think>x</think>y", "", True, ("x", "y")),
    ("qwen3", "plan</think>answer", "<|im_start|>assistant\n<think>\n", True, ("plan", "answer")),
    ("qwen3", "answer", "<think>\n\n</think>\n\n", False, ("", "answer")),
    ("qwen3", "<think>cut short", "", True, ("cut short", "")),
    ("deepseek_r1", "plan</think>answer", "", True, ("plan", "answer")),
    # R1 thinks first; a start tag it writes itself is a tag, not reasoning (as vLLM strips it)
    ("deepseek_r1", "<think>plan</think>answer", "", True, ("plan", "answer")),
    ("deepseek_r1", "\n<think>\nplan</think>answer", "", True, ("\nplan", "answer")),
    ("deepseek_r1", "<thi", "", True, ("<thi", "")),
    ("deepseek_r1", "still thinking", "", True, ("still thinking", "")),
    ("deepseek_r1", "answer", "", False, ("", "answer")),
    ("deepseek_r1", "a < b </thin", "", True, ("a < b </thin", "")),
    (
        "gpt_oss",
        "<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>final"
        "<|message|>answer",
        "",
        True,
        ("plan", "answer"),
    ),
    ("gpt_oss", "plain text, no channels", "", True, ("", "plain text, no channels")),
]


@pytest.mark.parametrize(("name", "text", "tail", "thinking", "expected"), CASES)
def test_split(name: str, text: str, tail: str, thinking: bool, expected: Split) -> None:
    assert split(name, text, tail, thinking) == expected


def test_in_reasoning_tracks_the_state() -> None:
    parser = create_reasoning_parser("deepseek_r1", "", True)
    assert parser.in_reasoning
    parser.feed("plan</think>")
    assert not parser.in_reasoning


def test_end_markers() -> None:
    assert end_marker("qwen3") == end_marker("deepseek_r1") == "</think>"
    assert end_marker("gpt_oss") == "<|channel|>final<|message|>"
