"""The engine's door for token ids: engine/protocol.py's check_token_ids (the one check) and
engine/builtin/sequence_builder.py's check_request_ids over every id a GenerateRequest gives.

The HTTP routes make the same check before any work (tests/api/test_validation.py); these hold
for a caller that comes without them (a sibling's prefill, a CoreClient used directly), after
which no step checks an id again.
"""

from __future__ import annotations

import pytest

from trtllm_gateway.engine.builtin.sequence_builder import check_request_ids
from trtllm_gateway.engine.protocol import (
    GenerateRequest,
    InvalidRequestError,
    SamplingParams,
    check_token_ids,
)

VOCAB = 8


def test_check_token_ids_names_the_param_and_the_first_bad_id() -> None:
    assert check_token_ids(iter([0, 7]), VOCAB, "prompt") == (0, 7)
    assert check_token_ids((), VOCAB, "prompt") == ()
    for ids, bad in (([1, 8, -1], 8), ([-1, 9], -1)):
        with pytest.raises(InvalidRequestError) as e:
            check_token_ids(ids, VOCAB, "stop_token_ids")
        assert e.value.param == "stop_token_ids"
        assert str(e.value) == (
            f"stop_token_ids has token id {bad} outside the vocabulary [0, {VOCAB})."
        )


@pytest.mark.parametrize(
    ("sp", "prompt", "param"),
    [
        (SamplingParams(), (1, VOCAB), "prompt"),
        (SamplingParams(stop_token_ids=(-1,)), (1,), "stop_token_ids"),
        (SamplingParams(logit_bias=((99, 1.0),)), (1,), "logit_bias"),
        (SamplingParams(allowed_token_ids=()), (1,), "allowed_token_ids"),
        (SamplingParams(allowed_token_ids=(3, VOCAB)), (1,), "allowed_token_ids"),
        (SamplingParams(logprobs=VOCAB + 1), (1,), "logprobs"),
        (SamplingParams(prompt_logprobs=-1), (1,), "prompt_logprobs"),
    ],
)
def test_check_request_ids_names_the_param(
    sp: SamplingParams, prompt: tuple[int, ...], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as e:
        check_request_ids(GenerateRequest("r", prompt, sp), VOCAB)
    assert e.value.param == param
    check_request_ids(GenerateRequest("r", (1, VOCAB - 1), SamplingParams(logprobs=VOCAB)), VOCAB)
