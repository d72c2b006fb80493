"""Every engine request's prompt is counted once, whoever ends it: prompt_tokens_total and the
access log agree with usage.prompt_tokens for a length finish, a stop string (the gateway ends
the request before the engine's final event), a client that leaves (499) and engine aborts."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from tests.api.ops_helpers import post_then_leave
from tests.conftest import MODEL
from tests.fake_engine import FakeEngine
from trtllm_gateway.engine.protocol import EngineDeadError, OverloadedError

PROMPT = list(range(5, 16))  # 11 token ids, sent as they are
URL = "/v1/completions"


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, **extra}


async def counted(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == "trtllm_gateway:prompt_tokens":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("no prompt_tokens counter")


def access_prompt_tokens(caplog: pytest.LogCaptureFixture) -> list[int]:
    records = [r for r in caplog.records if r.name == "trtllm_gateway.access"]
    return [r.fields["prompt_tokens"] for r in records if "prompt_tokens" in r.fields]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "extra",
    [
        {},  # the engine ends it (length)
        {"stop": ["world"]},  # the gateway ends it on a stop string
        {"stop": ["world"], "stream": True, "stream_options": {"include_usage": True}},
    ],
)
async def test_finishes_count_the_prompt_once(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, extra: dict[str, Any]
) -> None:
    caplog.set_level(logging.INFO, logger="trtllm_gateway.access")
    r = await client.post(URL, json=body(**extra))
    assert r.status_code == 200, r.text
    if extra.get("stream"):
        frames = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        usage = frames[-1]["usage"]
        finish = [c["finish_reason"] for f in frames for c in f["choices"] if c["finish_reason"]]
    else:
        usage = r.json()["usage"]
        finish = [r.json()["choices"][0]["finish_reason"]]
    assert finish == ["stop" if "stop" in extra else "length"]
    assert usage["prompt_tokens"] == len(PROMPT)
    assert await counted(client) == len(PROMPT)
    assert access_prompt_tokens(caplog) == [len(PROMPT)]


async def test_n_choices_count_each_engine_request(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=body(n=2, stop=["world"]))
    assert r.status_code == 200, r.text
    assert await counted(client) == 2 * len(PROMPT)


@pytest.mark.parametrize(
    ("failure", "status"),
    [
        ({"fail_on_generate": OverloadedError("full")}, 503),
        ({"fail_on_generate": EngineDeadError("gone")}, 503),
        ({"fail_after_tokens": 2}, 200),  # dies mid-stream: an error frame after the first byte
    ],
)
async def test_engine_aborts_count_the_prompt(
    client: httpx.AsyncClient,
    fake_engine: FakeEngine,
    caplog: pytest.LogCaptureFixture,
    failure: dict[str, Any],
    status: int,
) -> None:
    caplog.set_level(logging.INFO, logger="trtllm_gateway.access")
    for name, value in failure.items():
        setattr(fake_engine, name, value)
    r = await client.post(URL, json=body(stream=True))
    assert r.status_code == status, r.text
    if status == 200:
        assert '"error"' in r.text
    assert await counted(client) == len(PROMPT)
    assert access_prompt_tokens(caplog) == [len(PROMPT)]


async def test_a_client_that_leaves_counts_the_prompt(
    lifespan_app: FastAPI,
    client: httpx.AsyncClient,
    fake_engine: FakeEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client disconnects while its request is queued (499 in the access log)."""
    caplog.set_level(logging.INFO, logger="trtllm_gateway.access")
    fake_engine.first_token_delay_s = 30
    await post_then_leave(lifespan_app, URL, json.dumps(body()).encode())
    assert fake_engine.aborted
    assert await counted(client) == len(PROMPT)
    records = [r for r in caplog.records if r.name == "trtllm_gateway.access"]
    fields = records[0].fields  # type: ignore[attr-defined]
    assert fields["status"] == 499 and fields["prompt_tokens"] == len(PROMPT)
