"""Guided decoding, logit_bias and allowed_token_ids cross the remote-prefill wire intact."""

from __future__ import annotations

import pytest

from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.protocol import GuidedDecoding, SamplingParams


def test_sampling_round_trips_through_the_prefill_body() -> None:
    sp = SamplingParams(
        max_tokens=5,
        logit_bias=((3, 100.0), (7, -100.0)),
        allowed_token_ids=(1, 2, 3),
        stop_token_ids=(9,),
        guided=GuidedDecoding("json", '{"type": "object"}', start_after=(42,)),
    )
    sent = wire.encode(wire.PrefillBody.of("r1", (1, 2, 3), sp))  # what RemotePrefillEngine sends
    assert wire.decode(sent, wire.PrefillBody).sampling_params() == sp


def test_malformed_guided_is_refused() -> None:
    body = wire.PrefillBody(
        request_id="r1", prompt_token_ids=[1], sampling={"guided": {"spec": "x"}}
    )
    with pytest.raises(wire.SiblingWireError, match="bad sampling params"):
        body.sampling_params()
