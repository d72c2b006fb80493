"""A choice's output for formats whose markers are special tokens (harmony, mistral, deepseek,
llama3 JSON): the reply is detokenized with its special tokens, except the final stop token."""

from __future__ import annotations

from trtllm_gateway.engine.protocol import TokenEvent
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.chat.reply import ReplyPlan
from trtllm_gateway.routers.openai.choice_output import ChoiceOutput


def test_special_tokens_kept_but_not_the_stop_token(tokenizer: Tokenizer) -> None:
    start, end = tokenizer.encode("<|im_start|><|im_end|>", add_special_tokens=False)
    body = tokenizer.encode("hello", add_special_tokens=False)
    events = [TokenEvent((start,)), TokenEvent(tuple(body)), TokenEvent((end,), None, "stop", end)]
    kept = ChoiceOutput(tokenizer, keep_special_tokens=True)
    assert "".join(kept.feed(e).text for e in events) == "<|im_start|>hello"
    plain = ChoiceOutput(tokenizer)
    assert "".join(plain.feed(e).text for e in events) == "hello"


def test_which_plans_keep_special_tokens() -> None:
    assert ReplyPlan(reasoning="gpt_oss").keeps_special_tokens
    assert ReplyPlan(tool_family="mistral").keeps_special_tokens
    assert ReplyPlan(tool_family="deepseek_v3").keeps_special_tokens
    assert not ReplyPlan(tool_family="hermes").keeps_special_tokens
    assert not ReplyPlan(reasoning="qwen3").keeps_special_tokens
    assert not ReplyPlan().active
