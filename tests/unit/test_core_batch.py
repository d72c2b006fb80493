"""EngineCore.batch(): a step's emitted items split into token events and errors, each in order,
with nothing lost; a batch with no error sends its events as they were emitted."""

from __future__ import annotations

from tests.configs import builtin_config
from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.protocol import InvalidRequestError, TokenEvent


def test_batch_splits_events_from_errors_in_order() -> None:
    core = EngineCore(builtin_config())  # batch() needs no model: the health says loading
    a, b, c = TokenEvent((1,)), TokenEvent((2,)), TokenEvent((3,), finish_reason="stop")
    core._pending = [("r1", a), ("r2", InvalidRequestError("bad")), ("r3", b), ("r4", c)]
    batch = core.batch()
    assert batch.events == [("r1", a), ("r3", b), ("r4", c)]
    assert [(rid, e.kind) for rid, e in batch.errors] == [("r2", "invalid")]
    assert "bad" in batch.errors[0][1].message
    assert core._pending == []

    plain = [("r5", TokenEvent((5,))), ("r6", TokenEvent((6,)))]
    core._pending = list(plain)
    batch = core.batch()
    assert batch.events == plain and batch.errors == []
