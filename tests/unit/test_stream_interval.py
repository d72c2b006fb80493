"""engine/builtin/stream_interval.py: holding and flushing token events per request."""

from __future__ import annotations

from trtllm_gateway.engine.protocol import EngineDeadError, TokenEvent
from trtllm_gateway.engine.transport.stream_interval import StreamInterval


def tok(t: int, finish: str | None = None) -> TokenEvent:
    return TokenEvent((t,), finish_reason=finish)  # type: ignore[arg-type]


def test_interval_one_passes_through() -> None:
    events = [("a", tok(1)), ("a", tok(2))]
    assert StreamInterval(1)(list(events)) == events


def test_first_token_at_once_then_every_n_and_finish_flushes() -> None:
    si = StreamInterval(3)
    sent = [si([("a", tok(i, "length" if i == 7 else None))]) for i in range(8)]
    ids = [[ev.token_ids for _, ev in batch if isinstance(ev, TokenEvent)] for batch in sent]
    assert ids == [[(0,)], [], [], [(1, 2, 3)], [], [], [(4, 5, 6)], [(7,)]]
    assert sent[-1][0][1].finish_reason == "length"  # type: ignore[union-attr]
    assert si.holding == 0


def test_requests_are_independent_and_errors_drop_held_tokens() -> None:
    si = StreamInterval(2)
    assert [r for r, _ in si([("a", tok(1)), ("b", tok(1))])] == ["a", "b"]
    assert si([("a", tok(2)), ("b", tok(2))]) == []
    err = EngineDeadError("boom")
    out = si([("a", err), ("b", tok(3))])
    assert out[0] == ("a", err)
    assert out[1][0] == "b" and out[1][1].token_ids == (2, 3)  # type: ignore[union-attr]
    assert si.holding == 0
