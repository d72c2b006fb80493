"""web/tracing.py: shutdown flushes the queued spans within its bound, even to a dead collector
(issue 40, item 8: SIGTERM took 12.7 s instead of 3.0 s while the SDK retried its export for its
whole 10 s timeout)."""

from __future__ import annotations

import socket
import time

from starlette.datastructures import Headers

from tests.otlp_receiver import OtlpReceiver
from trtllm_gateway.web.tracing import FLUSH_ON_SHUTDOWN_S, Tracer


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connections are refused


def _one_span(tracer: Tracer) -> None:
    span, _ = tracer.start("llm_request", Headers(headers={}))
    span.end()


def test_shutdown_with_a_dead_collector_is_bounded() -> None:
    tracer = Tracer(f"http://127.0.0.1:{_dead_port()}")
    _one_span(tracer)
    t0 = time.monotonic()
    tracer.shutdown()
    took = time.monotonic() - t0
    assert took < FLUSH_ON_SHUTDOWN_S + 1.0, took


def test_shutdown_still_flushes_to_a_live_collector() -> None:
    receiver = OtlpReceiver().start()
    try:
        tracer = Tracer(receiver.url)
        _one_span(tracer)
        tracer.shutdown()
        assert [s.name for s in receiver.wait_for(lambda s: s.name == "llm_request")] == [
            "llm_request"
        ]
    finally:
        receiver.stop()
