"""X-Request-Id: a valid client id is the request id and is echoed; otherwise one is made; the
end-of-request log line carries it with the model, status, tokens, TTFT, e2e and finish reason."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from tests.api.ops_helpers import CHAT
from tests.fake_engine import FakeEngine
from trtllm_gateway.web.logs import JsonFormatter, RequestIdFilter


async def test_client_id_is_used_and_echoed(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    assert r.json()["id"] == "abc-123"
    stream = {**CHAT, "stream": True}
    r = await client.post(
        "/v1/completions",
        json={"model": "tiny-model", "prompt": "x"},
        headers={"X-Request-Id": "c-1"},
    )
    assert r.json()["id"] == "c-1"
    r = await client.post("/v1/chat/completions", json=stream, headers={"X-Request-Id": "s-1"})
    assert r.headers["x-request-id"] == "s-1"
    assert '"id":"s-1"' in r.text


async def test_generated_when_missing_or_invalid(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.headers["x-request-id"] == r.json()["id"]
    assert r.json()["id"].startswith("chatcmpl-")
    for bad in ("x" * 200, "has space", 'quote"d', "semi;colon"):
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": bad})
        assert r.headers["x-request-id"] == r.json()["id"] != bad
    health = await client.get("/health", headers={"X-Request-Id": "probe-1"})
    assert health.headers["x-request-id"] == "probe-1"


async def test_one_log_line_per_request(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trtllm_gateway.access")
    await client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "log-1"})
    records = [r for r in caplog.records if r.name == "trtllm_gateway.access"]
    assert len(records) == 1
    fields = records[0].fields  # type: ignore[attr-defined]
    assert fields["request_id"] == "log-1"
    assert fields["status"] == 200
    assert fields["model"] == "tiny-model"
    assert fields["completion_tokens"] == 8
    assert fields["prompt_tokens"] > 0
    assert fields["finish_reason"] == "length"
    assert fields["ttft_s"] is not None and fields["e2e_s"] >= fields["ttft_s"]
    line = JsonFormatter().format(records[0])
    assert json.loads(line)["request_id"] == "log-1"
    assert "authorization" not in line.lower()


def test_filter_stamps_request_id() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    assert RequestIdFilter().filter(record)
    assert record.request_id == "-"  # type: ignore[attr-defined]
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "hello"
    assert out["level"] == "info"


async def test_same_client_id_twice_at_once_gets_distinct_engine_ids(
    client: httpx.AsyncClient, fake_engine: FakeEngine
) -> None:
    """Two requests with one X-Request-Id in flight together: both answer with that id, and the
    engine sees two different request ids (the built-in engine refuses a duplicate)."""
    headers = {"X-Request-Id": "dup-1"}
    stream = {**CHAT, "stream": True}
    first, second = await asyncio.gather(
        client.post("/v1/chat/completions", json=stream, headers=headers),
        client.post("/v1/chat/completions", json=stream, headers=headers),
    )
    assert first.headers["x-request-id"] == second.headers["x-request-id"] == "dup-1"
    assert '"id":"dup-1"' in first.text and '"id":"dup-1"' in second.text
    ids = [r.request_id for r in fake_engine.requests]
    assert len(set(ids)) == 2 and all(i.startswith("dup-1-") for i in ids)
