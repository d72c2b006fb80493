"""engine/transport/messages: every message survives the wire; errors come back as the same kind."""

from __future__ import annotations

import pytest

from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    EngineDeadError,
    EngineHealth,
    EngineInfo,
    GuidedDecoding,
    InvalidRequestError,
    OverloadedError,
    RequestFailedError,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from trtllm_gateway.engine.transport import messages as m
from trtllm_gateway.web.errors import from_engine_error

SAMPLING = SamplingParams(
    max_tokens=7,
    temperature=0.5,
    seed=3,
    stop_token_ids=(2, 5),
    logit_bias=((4, -100.0),),
    allowed_token_ids=(1, 4),
    guided=GuidedDecoding("json", '{"type": "object"}', (9,)),
)


@pytest.mark.parametrize(
    "msg",
    [
        m.Add("r1", (1, 2, 3), SAMPLING),
        m.Add("r2", (1,), SamplingParams(), hold_kv=True),
        m.Add(
            "r3",
            (1,),
            SamplingParams(),
            first_token_ids=(7,),
            first_logprobs=(TokenLogprob(7, -0.25, ((7, -0.25), (8, -2.0))),),
        ),
        m.Abort("r1"),
        m.ExportKv(4, "r2"),
        m.ReleaseKv("r2"),
        m.Stop(),
    ],
)
def test_inbound_round_trip(msg: m.Inbound) -> None:
    assert m.decode_inbound(m.encode(msg)) == msg


def test_output_batch_round_trip() -> None:
    last = TokenEvent((5, 6), None, finish_reason="stop", stop_token_id=6, usage=Usage(3, 2, 1))
    batch = m.OutputBatch(
        events=[("a", TokenEvent((4,), (TokenLogprob(4, -0.1),))), ("b", last)],
        errors=[("c", m.RequestError("invalid", "bad", "logit_bias"))],
        health=EngineHealth(state="ready", running=2, kv_usage=0.5),
    )
    assert m.decode_outbound(m.encode(batch)) == batch
    ready = m.Ready(EngineInfo("x", 64, 100, (2,)), "/models/x", EngineHealth("ready"))
    assert m.decode_outbound(m.encode(ready)) == ready
    for msg in (m.Reply(1), m.Reply(2, m.RequestError("invalid", "no KV")), m.Dead("boom")):
        assert m.decode_outbound(m.encode(msg)) == msg


def test_probe_round_trip() -> None:
    assert m.decode_probe(m.encode(m.PrefixProbe((1, 2)))) == m.PrefixProbe((1, 2))
    assert m.decode_probe(m.encode(m.ProbeReply(32))) == m.ProbeReply(32)


def test_errors_keep_their_kind_and_param() -> None:
    def back(exc: Exception) -> Exception:
        return m.decode_outbound(m.encode(m.Reply(0, m.RequestError.of(exc)))).error.exception()  # type: ignore[union-attr]

    ctx = back(ContextTooLongError(10, 20, 16))
    assert isinstance(ctx, ContextTooLongError)
    assert (ctx.prompt_tokens, ctx.max_tokens, ctx.max_model_len) == (10, 20, 16)
    bad = back(InvalidRequestError("token 99999 out of range", param="logit_bias"))
    assert type(bad) is InvalidRequestError and bad.param == "logit_bias"
    assert str(bad) == "token 99999 out of range"
    assert type(back(OverloadedError("full"))) is OverloadedError
    dead = back(RuntimeError("step failed"))
    assert type(dead) is EngineDeadError and str(dead) == "step failed"
    # One request's failure by the engine's fault (issue 40): a 500 for it, not a dead engine.
    failed = back(RequestFailedError("logits processor Ban failed"))
    assert type(failed) is RequestFailedError and str(failed) == "logits processor Ban failed"
    err = from_engine_error(failed)
    assert (err.status_code, err.code) == (500, "request_failed")


def test_garbage_is_refused() -> None:
    import msgspec

    with pytest.raises(msgspec.DecodeError):
        m.decode_inbound(m.encode(m.Dead("not inbound")))
