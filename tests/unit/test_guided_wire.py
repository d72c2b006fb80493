"""Guided decoding, logit_bias and allowed_token_ids cross the remote-prefill wire intact."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from trtllm_gateway.app.errors import BadRequestError
from trtllm_gateway.engine.protocol import GuidedDecoding, SamplingParams
from trtllm_gateway.routers.disagg import _sampling


def test_sampling_round_trips_through_json() -> None:
    sp = SamplingParams(
        max_tokens=5,
        logit_bias=((3, 100.0), (7, -100.0)),
        allowed_token_ids=(1, 2, 3),
        stop_token_ids=(9,),
        guided=GuidedDecoding("json", '{"type": "object"}', start_after=(42,)),
    )
    wire = json.loads(json.dumps(asdict(sp)))  # what RemotePrefillEngine sends
    assert _sampling(wire) == sp


def test_malformed_guided_is_a_400() -> None:
    with pytest.raises(BadRequestError) as exc:
        _sampling({"guided": {"spec": "x"}})
    assert exc.value.param == "sampling"
