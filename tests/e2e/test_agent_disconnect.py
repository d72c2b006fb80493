"""A client that drops a /v1/responses or /v1/messages stream stops the engine's work, as chat's
does (tests/e2e/test_disconnect.py): the named-event stream closes the run like chat's stream."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.e2e.server import Server

MODEL = "SmolLM2-135M-Instruct"
STORY = "Tell me a very long story."


def _wait_idle(server: Server, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = server.metric("trtllm_gateway:num_requests_running")
        kv = server.metric("trtllm_gateway:kv_cache_usage_perc")
        if running == 0 and kv == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"engine still busy: running={running} kv={kv}")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"input": STORY, "max_output_tokens": 4000, "ignore_eos": True}),
        (
            "/v1/messages",
            {"max_tokens": 4000, "messages": [{"role": "user", "content": STORY}]},
        ),
    ],
    ids=["responses", "messages"],
)
def test_mid_stream_disconnect_frees_the_engine(
    server: Server, path: str, body: dict[str, Any]
) -> None:
    _wait_idle(server)
    request = {"model": MODEL, "stream": True, "temperature": 0, **body}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + path, json=request) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(30)]  # event and data lines, ~10 deltas in
        assert any(line.startswith("event:") for line in got)
        assert server.metric("trtllm_gateway:num_requests_running") == 1
    _wait_idle(server)
