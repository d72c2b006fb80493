"""GatewayServer's start-up watch (issue 23): what a slow start waits on is logged every 30 s,
and --startup-timeout ends a start that never gets ready with exit status 4."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
import uvicorn

from trtllm_gateway.app import server as server_mod
from trtllm_gateway.app.server import STARTUP_TIMEOUT_EXIT, GatewayServer
from trtllm_gateway.engine.protocol import EngineHealth


@dataclass
class _State:
    health_now: EngineHealth = field(default_factory=lambda: EngineHealth("loading"))

    def health(self) -> EngineHealth:
        return self.health_now


@dataclass
class _Drain:
    state: _State | None = None
    requested: bool = False


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(server_mod.time, "monotonic", c.monotonic)
    return c


def _server(drain: _Drain, timeout: float) -> GatewayServer:
    return GatewayServer(uvicorn.Config(app=lambda: None), drain, timeout)  # type: ignore[arg-type]


def test_a_slow_start_says_what_it_waits_on_every_30_s(
    clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    drain = _Drain(_State(EngineHealth("loading", detail="building CPU kernels")))
    srv = _server(drain, timeout=0)
    with caplog.at_level(logging.WARNING):
        for t in range(0, 95, 5):
            clock.now = 1000.0 + t
            srv._watch_startup()
    lines = [r.getMessage() for r in caplog.records if "not ready after" in r.getMessage()]
    assert lines == [f"not ready after {s} s: building CPU kernels" for s in (30, 60, 90)]
    assert not srv.should_exit  # 0: wait for ever


def test_the_startup_timeout_exits_with_its_own_status(
    clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    drain = _Drain(None)  # the lifespan has not even bound its state yet
    srv = _server(drain, timeout=20)
    clock.now += 10
    srv._watch_startup()
    assert not srv.should_exit
    drain.state = _State(EngineHealth("loading", detail="waiting for the CPU kernel build"))
    clock.now += 11
    with caplog.at_level(logging.ERROR):
        srv._watch_startup()
    assert srv.should_exit and srv.startup_failed
    assert "--startup-timeout 20 s" in caplog.text
    assert "waiting for the CPU kernel build" in caplog.text
    assert STARTUP_TIMEOUT_EXIT == 4


def test_a_ready_or_failed_start_stops_the_watch(clock: _Clock) -> None:
    drain = _Drain(_State(EngineHealth("ready")))
    srv = _server(drain, timeout=5)
    srv._watch_startup()
    clock.now += 100
    assert not srv._starting and not srv.should_exit
    drain.state = _State(EngineHealth("dead", detail="model failed to load"))
    srv = _server(drain, timeout=5)
    clock.now += 100
    srv._watch_startup()
    assert not srv.should_exit  # a failed load stays up and says why in /health
