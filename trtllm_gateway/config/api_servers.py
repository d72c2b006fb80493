"""What several API servers (--api-server-count) cannot share, as the flags' validation and the
auto count (app/api_server_count.py) both read it."""

from __future__ import annotations

from trtllm_gateway.config.disagg import DisaggConfig
from trtllm_gateway.config.engine import EngineConfig


def unshareable(engine: EngineConfig, disagg: DisaggConfig) -> str | None:
    """Why this instance runs one API server only, or None. The servers share one built-in core
    process (an encode instance has none), and one --kv-events-zmq address cannot be bound by
    every server."""
    if engine.engine != "builtin" or not engine.engine_process:
        return "needs --engine builtin with its core process"
    if engine.mode == "encode":
        return "does not run --mode encode"
    if disagg.kv_events_zmq:
        return "cannot publish --kv-events-zmq"
    return None
