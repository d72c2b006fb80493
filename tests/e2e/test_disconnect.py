"""A client that drops a long stream, or leaves before the first byte, stops the engine's work."""

from __future__ import annotations

import contextlib
import time

import httpx

from tests.e2e.server import Server

LONG = {
    "model": "SmolLM2-135M-Instruct",
    "messages": [{"role": "user", "content": "Tell me a very long story."}],
    "max_tokens": 4000,
    "ignore_eos": True,
}


def _wait_idle(server: Server, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = server.metric("trtllm_gateway:num_requests_running")
        kv = server.metric("trtllm_gateway:kv_cache_usage_perc")
        if running == 0 and kv == 0:
            assert server.metric("trtllm_gateway:kv_active_blocks") == 0
            return
        time.sleep(0.1)
    raise AssertionError(f"engine still busy: running={running} kv={kv}")


def test_mid_stream_disconnect_frees_the_engine(server: Server) -> None:
    _wait_idle(server)
    with (
        httpx.Client(timeout=30) as c,
        c.stream("POST", f"{server.url}/v1/chat/completions", json={**LONG, "stream": True}) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(12)]
        assert any(line.startswith("data:") for line in got)
        assert server.metric("trtllm_gateway:num_requests_running") == 1
        assert server.metric("trtllm_gateway:kv_cache_usage_perc") > 0
        # The absolute gauge Dynamo's router reads: the stream's blocks, of all there are.
        held = server.metric("trtllm_gateway:kv_active_blocks")
        total = server.metric("trtllm_gateway:kv_total_blocks")
        assert 1 <= held < total
    _wait_idle(server)


def test_disconnect_before_first_byte_frees_the_engine(server: Server) -> None:
    _wait_idle(server)
    before = server.metric("trtllm_gateway:http_requests_client_disconnected_total")
    with contextlib.suppress(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json=LONG, timeout=1.0)
    _wait_idle(server)
    after = server.metric("trtllm_gateway:http_requests_client_disconnected_total")
    assert after == before + 1
