"""engine/disagg/sibling_wire.py: the JSON both sides of the sibling protocol write and read.

The bytes stay those of protocol version 1 as the two hand-written halves sent them (an older
sibling keeps working), and what one side writes, the other reads back unchanged.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict

import pytest

from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.kv_events.log import BlockRemoved
from trtllm_gateway.engine.protocol import (
    DisaggParams,
    GuidedDecoding,
    PrefillResult,
    SamplingParams,
    TokenLogprob,
)

SAMPLING = SamplingParams(
    max_tokens=4,
    seed=-(2**63),
    logit_bias=((3, -2.5),),
    guided=GuidedDecoding("regex", "a+", (9,)),
    stop_token_ids=(1, 2),
    extra_args=(("hello_world", 1), ("ban", (5, "x", 1.5))),
)


def _compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def test_prefill_body_bytes_and_round_trip() -> None:
    body = wire.PrefillBody.of("r-1", (5, 6, 7), SAMPLING)
    old = {
        "protocol_version": 1,
        "request_id": "r-1",
        "prompt_token_ids": [5, 6, 7],
        "sampling": asdict(SAMPLING),
    }
    assert wire.encode(body) == _compact(old)
    assert wire.decode(_compact(old), wire.PrefillBody).sampling_params() == SAMPLING


def test_prefill_body_without_extra_args_is_what_an_older_sibling_reads() -> None:
    plain = SamplingParams(max_tokens=3)
    body = wire.PrefillBody.of("r", (1,), plain)
    assert "extra_args" not in body.sampling
    assert body.sampling_params() == plain


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"request_id": "", "prompt_token_ids": [1]}, "request_id"),
        ({"prompt_token_ids": [1]}, "request_id"),
        ({"request_id": "r", "prompt_token_ids": []}, "prompt_token_ids"),
        ({"request_id": "r", "prompt_token_ids": ["1"]}, "prompt_token_ids"),
        ({"request_id": "r", "prompt_token_ids": [1], "extra": 1}, "extra"),
        ({"request_id": "r", "prompt_token_ids": [1], "protocol_version": 0}, "protocol_version"),
    ],
)
def test_bad_prefill_body_names_its_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(wire.SiblingWireError) as exc:
        wire.decode(_compact(body), wire.PrefillBody)
    assert exc.value.field == field


def test_unknown_sampling_key_is_refused() -> None:
    body = wire.PrefillBody(request_id="r", prompt_token_ids=[1], sampling={"top_q": 1})
    with pytest.raises(wire.SiblingWireError, match="bad sampling params"):
        body.sampling_params()


def test_prefill_answer_bytes_and_generation_only() -> None:
    lps = (TokenLogprob(7, -0.25, ((7, -0.25), (8, -2.0))),)
    res = PrefillResult("r-1", (7,), lps, prompt_tokens=3, cached_tokens=1, opaque_state=b"\x00s")
    raw = wire.encode(wire.PrefillAnswer.of(res, lease_s=30.0))
    assert json.loads(raw) == {
        "protocol_version": 1,
        "request_id": "r-1",
        "first_token_ids": [7],
        "first_logprobs": [{"token_id": 7, "logprob": -0.25, "top": [[7, -0.25], [8, -2.0]]}],
        "prompt_tokens": 3,
        "cached_tokens": 1,
        "disaggregated_params": {
            "request_type": "context_only",
            "ctx_request_id": "r-1",
            "opaque_state": base64.b64encode(b"\x00s").decode(),
        },
        "lease_s": 30.0,
    }
    disagg = wire.decode(raw, wire.PrefillAnswer).generation_only(kv_payload=b"kv")
    assert disagg == DisaggParams("generation_only", (7,), lps, "r-1", b"\x00s")
    assert disagg.kv_payload == b"kv"


def test_prefill_answer_needs_its_state() -> None:
    with pytest.raises(wire.SiblingWireError):
        wire.decode(b'{"first_token_ids":[7]}', wire.PrefillAnswer)
    bad = (
        b'{"first_token_ids":[7],"disaggregated_params":{"ctx_request_id":"r","opaque_state":"%"}}'
    )
    with pytest.raises(wire.SiblingWireError, match="base64"):
        wire.decode(bad, wire.PrefillAnswer).generation_only(None)


def test_kv_events_lines() -> None:
    hello = wire.Hello(instance="abc", block_size=4, num_blocks=8, next_id=3)
    assert wire.encode_line(hello) == (
        b'{"type":"Hello","instance":"abc","block_size":4,"num_blocks":8,"next_id":3}\n'
    )
    assert wire.encode_line(wire.Resync()) == b'{"type":"Resync"}\n'
    assert wire.decode_line(wire.encode_line(hello)) == hello
    assert wire.decode_line(b'{"type":"Heartbeat","next_id":5}') == wire.Heartbeat(next_id=5)
    line = wire.decode_line(b'{"event_id":4,"ts":1.5,"type":"BlockRemoved","block_hashes":[9]}')
    assert line == wire.KvEventLine(4, BlockRemoved((9,)))
    with pytest.raises(wire.SiblingWireError):
        wire.decode_line(b'{"type":"Nonsense"}')


def test_paths() -> None:
    assert wire.kv_path("ctx-1") == "/internal/v1/kv/ctx-1"
    assert wire.PREFILL_PATH == "/internal/v1/prefill"


def test_a_busy_answers_queue_reads_back_and_unknown_counts_stay_unknown() -> None:
    """A busy sibling's 503 carries its queue in two headers (any case); an older sibling's
    503 without them, or a malformed count, is an unknown queue, never a zero one."""
    queue = wire.QueueReport(requests=3, tokens=6144)
    headers = {k.upper(): v for k, v in queue.headers().items()}
    assert wire.QueueReport.of_headers(headers) == queue
    assert wire.QueueReport.of_headers({}) == wire.QueueReport(None, None)
    bad = {wire.QUEUE_REQUESTS_HEADER: "-1", wire.QUEUE_TOKENS_HEADER: "9" * 30}
    assert wire.QueueReport.of_headers(bad) == wire.QueueReport(None, None)
