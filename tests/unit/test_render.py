"""routers/openai/choice_output.py (stop strings and multi-byte hold-back, finish),
routers/openai/logprobs.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from trtllm_gateway.engine.protocol import TokenEvent, TokenLogprob, Usage
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.choice_output import ChoiceDelta, ChoiceOutput
from trtllm_gateway.routers.openai.logprobs import chat_logprobs, completion_logprobs


def run(
    renderer: ChoiceOutput, ids: Sequence[int], eos: int | None = None, per_event: int = 1
) -> list[ChoiceDelta]:
    """Feed ids in events of `per_event` tokens; the last event finishes (with eos if given)."""
    ids = [*ids, eos] if eos is not None else list(ids)
    deltas = []
    for start in range(0, len(ids), per_event):
        chunk = tuple(ids[start : start + per_event])
        last = start + per_event >= len(ids)
        event = TokenEvent(
            token_ids=chunk,
            finish_reason=("stop" if eos is not None else "length") if last else None,
            stop_token_id=eos if last else None,
            usage=Usage(3, len(ids)) if last else None,
        )
        deltas.append(renderer.feed(event))
        if renderer.finished:
            break
    return deltas


def text_of(deltas: Sequence[ChoiceDelta]) -> str:
    return "".join(d.text for d in deltas)


def test_plain_text_and_finish(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Hello world 你好", add_special_tokens=False)
    r = ChoiceOutput(tokenizer)
    deltas = run(r, ids)
    assert text_of(deltas) == "Hello world 你好"
    assert deltas[-1].finish_reason == "length"
    assert r.completion_tokens == len(ids)
    assert r.usage == Usage(3, len(ids))


@pytest.mark.parametrize("per_event", [1, 2, 5])
def test_stop_string_split_across_tokens(tokenizer: Tokenizer, per_event: int) -> None:
    text = "Hello world STOP here"
    ids = tokenizer.encode(text, add_special_tokens=False)
    r = ChoiceOutput(tokenizer, stop=["STOP"])
    deltas = run(r, ids, per_event=per_event)
    assert text_of(deltas) == "Hello world "
    assert (r.finish_reason, r.stop_reason) == ("stop", "STOP")
    # Nothing of the stop string was ever shown, even before it was complete.
    assert all("S" not in d.text for d in deltas)


def test_include_stop_str_in_output(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Hello world STOP here", add_special_tokens=False)
    r = ChoiceOutput(tokenizer, stop=["STOP", "zzz"], include_stop_str_in_output=True)
    assert text_of(run(r, ids)) == "Hello world STOP"
    assert r.text == "Hello world STOP"


def test_partial_stop_is_released(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("the STAR and ST", add_special_tokens=False)
    r = ChoiceOutput(tokenizer, stop=["STOP"])
    deltas = run(r, ids)
    assert text_of(deltas) == "the STAR and ST"  # the final event flushes the held "ST"
    assert r.finish_reason == "length"
    assert r.stop_reason is None


def test_earliest_stop_wins(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("one two three", add_special_tokens=False)
    r = ChoiceOutput(tokenizer, stop=["three", "two"])
    assert text_of(run(r, ids, per_event=100)) == "one "
    assert r.stop_reason == "two"


def test_multibyte_hold_back(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("😀🎉👍🏽", add_special_tokens=False)
    assert len(ids) > 3  # byte-level pieces of the emoji
    deltas = run(ChoiceOutput(tokenizer), ids)
    assert all("\ufffd" not in d.text for d in deltas)
    assert any(d.text == "" for d in deltas)
    assert text_of(deltas) == "😀🎉👍🏽"


def test_stop_token_id_reason_and_eos(tokenizer: Tokenizer) -> None:
    eos = tokenizer.eos_token_id
    assert eos is not None
    ids = tokenizer.encode("Hi", add_special_tokens=False)
    r = ChoiceOutput(tokenizer)
    assert text_of(run(r, ids, eos=eos)) == "Hi"
    assert (r.finish_reason, r.stop_reason) == ("stop", None)
    r = ChoiceOutput(tokenizer, stop_token_ids=[eos])
    run(r, ids, eos=eos)
    assert r.stop_reason == eos


def test_chat_logprobs_shape_and_clamp(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Hi 😀", add_special_tokens=False)
    lps = [TokenLogprob(i, -0.5, ((i, -0.5), (ids[0], float("-inf")))) for i in ids]
    shaped = chat_logprobs(tokenizer, lps, top_n=2)
    assert [e.bytes for e in shaped] == [list(tokenizer.token_bytes(i)) for i in ids]
    assert b"".join(bytes(e.bytes or []) for e in shaped) == "Hi 😀".encode()
    assert shaped[0].top_logprobs[1].logprob == -9999.0
    assert len(chat_logprobs(tokenizer, lps, top_n=1)[0].top_logprobs) == 1


def test_completion_logprobs_shape(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Hello world", add_special_tokens=False)
    lps = [None] + [TokenLogprob(i, -1.0, ((ids[0], -0.1),)) for i in ids[1:]]
    shaped = completion_logprobs(tokenizer, ids, lps, top_n=1, text_offset=10)
    assert shaped.token_logprobs[0] is None
    assert shaped.top_logprobs[0] is None
    assert shaped.text_offset[0] == 10
    assert "".join(shaped.tokens) == "Hello world"
    top = shaped.top_logprobs[1]
    assert top is not None
    assert shaped.tokens[1] in top
    assert shaped.tokens[0] in top


def test_completion_logprobs_unknown_value_is_null(tokenizer: Tokenizer) -> None:
    """NaN is the engines' "not known" (TensorRT-LLM's prompt logprobs give a top-k dict per
    position without the real token; docs/trtllm.md): the wire says null, never -9999."""
    ids = tokenizer.encode("Hello world", add_special_tokens=False)
    lps = [None, TokenLogprob(ids[1], float("nan"), ((ids[0], -0.1),))]
    shaped = completion_logprobs(tokenizer, ids[:2], lps, top_n=1, text_offset=0)
    assert shaped.token_logprobs == [None, None]
    assert shaped.top_logprobs[1] == {tokenizer.token_text(ids[0]): -0.1}
