"""Admission control: --max-queued-requests past --max-batch-size gives 503 + Retry-After before
any work, and every exit path (success, error, validation failure) gives the slot back."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from tests.api.ops_helpers import CHAT, drain_of, serve, state_of, wait_until
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import GenerateRequest, OverloadedError, PrefillResult


async def test_full_queue_is_503_before_any_work(
    settings: Settings, fake_engine: FakeEngine
) -> None:
    fake_engine.delay_s = 0.02
    async with serve(settings, fake_engine, max_batch_size=1, max_queued_requests=1) as (
        app,
        client,
    ):
        admission = drain_of(app).admission
        long = {**CHAT, "max_tokens": 60, "ignore_eos": True}  # ~1.2 s each
        held = [
            asyncio.create_task(client.post("/v1/chat/completions", json={**long, "stream": s}))
            for s in (True, False)
        ]
        await wait_until(lambda: len(fake_engine.requests) >= 2)  # both admitted and running
        seen = len(fake_engine.requests)
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
        r = await client.post("/v1/completions", json={"model": "tiny-model", "prompt": "hi"})
        assert r.status_code == 503
        assert len(fake_engine.requests) == seen  # refused before reaching the engine
        assert all(r.status_code == 200 for r in await asyncio.gather(*held))
        assert admission.in_flight == 0
        metrics = (await client.get("/metrics")).text
        assert "trtllm_gateway:num_requests_in_flight 0.0" in metrics
        assert "trtllm_gateway:num_requests_queued 0.0" in metrics
        assert 'trtllm_gateway:admission_rejected_total{reason="queue_full"} 2.0' in metrics
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_n_counts_as_engine_requests(settings: Settings, fake_engine: FakeEngine) -> None:
    fake_engine.delay_s = 0.02
    async with serve(settings, fake_engine, max_batch_size=1, max_queued_requests=1) as (
        app,
        client,
    ):
        admission = drain_of(app).admission
        first = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
        await wait_until(lambda: admission.in_flight >= 1)
        r = await client.post("/v1/chat/completions", json={**CHAT, "n": 2})
        assert r.status_code == 503
        batch = {"model": "tiny-model", "prompt": ["a", "b"], "max_tokens": 2}
        assert (await client.post("/v1/completions", json=batch)).status_code == 503
        assert (await first).status_code == 200
        # Alone, a request larger than the limit is still served.
        assert (await client.post("/v1/chat/completions", json={**CHAT, "n": 3})).status_code == 200
        assert admission.in_flight == 0


async def test_every_exit_path_releases(settings: Settings, fake_engine: FakeEngine) -> None:
    async with serve(settings, fake_engine, max_batch_size=1, max_queued_requests=0) as (
        app,
        client,
    ):
        admission = drain_of(app).admission
        bad = {**CHAT, "top_logprobs": 2}  # 400 from the route's checks, after admission
        assert (await client.post("/v1/chat/completions", json=bad)).status_code == 400
        too_long = {**CHAT, "max_tokens": 10_000}
        assert (await client.post("/v1/chat/completions", json=too_long)).status_code == 400
        fake_engine.fail_on_generate = OverloadedError("busy")
        for stream in (False, True):
            r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
            assert r.status_code == 503
        fake_engine.fail_on_generate = None
        fake_engine.fail_after_tokens = 2  # fails mid-stream: error frame, then [DONE]
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200
        assert '"error"' in r.text
        assert admission.in_flight == 0
        fake_engine.fail_after_tokens = None
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_unlimited_by_default(client: httpx.AsyncClient) -> None:
    results = await asyncio.gather(
        *(client.post("/v1/chat/completions", json=CHAT) for _ in range(8))
    )
    assert [r.status_code for r in results] == [200] * 8


async def test_admission_follows_the_engine_batch_size(
    settings: Settings, fake_engine: FakeEngine
) -> None:
    """The engine reports max_batch_size 1 (its engine args overrode the flag's 8): with one
    queued slot, the third concurrent request is refused."""
    fake_engine.info = dataclasses.replace(fake_engine.info, max_batch_size=1)
    fake_engine.delay_s = 0.02
    async with serve(settings, fake_engine, max_batch_size=8, max_queued_requests=1) as (
        app,
        client,
    ):
        admission = drain_of(app).admission
        assert (admission.running_limit, admission.capacity) == (1, 2)
        long = {**CHAT, "max_tokens": 40, "ignore_eos": True}
        held = [asyncio.create_task(client.post("/v1/chat/completions", json=long)) for _ in "ab"]
        await wait_until(lambda: admission.in_flight == 2)
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 503
        assert all(r.status_code == 200 for r in await asyncio.gather(*held))


async def test_sibling_prefill_counts_against_admission(
    settings: Settings, fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/internal/v1/prefill takes a slot: with one running and none queued, a second context
    phase while the first runs is a 503, and the slot comes back afterwards."""
    gate = asyncio.Event()
    real_prefill = fake_engine.prefill

    async def slow_prefill(req: GenerateRequest) -> PrefillResult:
        await gate.wait()
        return await real_prefill(req)

    monkeypatch.setattr(fake_engine, "prefill", slow_prefill)
    body = {"request_id": "ctx-1", "prompt_token_ids": [5, 6, 7]}
    async with serve(
        settings,
        fake_engine,
        mode="prefill",
        max_batch_size=1,
        max_queued_requests=0,
        internal_api_key="int-key",
    ) as (app, client):
        client.headers["Authorization"] = "Bearer int-key"
        admission = drain_of(app).admission
        first = asyncio.create_task(client.post("/internal/v1/prefill", json=body))
        await wait_until(lambda: admission.in_flight == 1)
        r = await client.post("/internal/v1/prefill", json={**body, "request_id": "ctx-2"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
        # The decode side's policy reads the queue it would wait behind (issue 41 item 5).
        assert r.headers["x-prefill-queue-requests"] == "1"
        assert r.headers["x-prefill-queue-tokens"] == "3"
        gate.set()
        assert (await first).status_code == 200
        assert admission.in_flight == 0


async def test_one_request_runs_at_most_max_running_choices_at_once(
    settings: Settings, fake_engine: FakeEngine
) -> None:
    """n=7 with --max-running-choices 2: never more than two of its engine requests running,
    every choice answered, and it counts 2 against the admission limit (issue 24 item 8)."""
    fake_engine.delay_s = 0.01
    peak = 0
    health = fake_engine.health

    def watched() -> object:
        nonlocal peak
        peak = max(peak, health().running)
        return health()

    async with serve(settings, fake_engine, max_running_choices=2) as (app, client):
        admission = drain_of(app).admission
        body = {**CHAT, "n": 7, "max_tokens": 8, "ignore_eos": True}
        task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await wait_until(lambda: admission.in_flight > 0)
        assert admission.in_flight == 2
        while not task.done():
            watched()
            await asyncio.sleep(0.002)
        r = task.result()
        assert r.status_code == 200
        assert sorted(c["index"] for c in r.json()["choices"]) == list(range(7))
        assert len(fake_engine.requests) == 7
        assert 1 <= peak <= 2, peak
        assert admission.in_flight == 0


def test_queued_work_is_bounded_by_default() -> None:
    s = Settings()
    assert (s.max_queued_requests, s.max_running_choices) == (256, 16)


async def test_a_full_prefill_queue_answers_503_with_the_queue(
    settings: Settings, fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-queued-prefill-tokens (issue 41 item 5): past the bound a context phase is refused
    at once with the queue in the answer, before the engine sees it, instead of waiting behind
    the queue until the decode side's deadline; the queue empties with its requests."""
    gate = asyncio.Event()
    real_prefill = fake_engine.prefill

    async def slow_prefill(req: GenerateRequest) -> PrefillResult:
        await gate.wait()
        return await real_prefill(req)

    monkeypatch.setattr(fake_engine, "prefill", slow_prefill)
    long = list(range(5, 45))  # 40 tokens
    async with serve(
        settings,
        fake_engine,
        mode="prefill",
        max_queued_prefill_tokens=64,
        internal_api_key="int-key",
    ) as (app, client):
        client.headers["Authorization"] = "Bearer int-key"
        queue = state_of(app).prefill_queue

        def post(request_id: str) -> asyncio.Task[httpx.Response]:
            body = {"request_id": request_id, "prompt_token_ids": long}
            return asyncio.create_task(client.post("/internal/v1/prefill", json=body))

        first = post("ctx-1")
        await wait_until(lambda: queue.requests == 1)
        seen = len(fake_engine.requests)
        r = await post("ctx-2")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "prefill_queue_full"
        assert r.headers["x-prefill-queue-requests"] == "1"
        assert r.headers["x-prefill-queue-tokens"] == "40"
        assert len(fake_engine.requests) == seen
        gate.set()
        assert (await first).status_code == 200
        assert (queue.requests, queue.tokens) == (0, 0)
        assert (await post("ctx-3")).status_code == 200


async def test_the_engines_overload_answers_503_with_the_queue(
    settings: Settings, fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own bound (KV held for siblings) is the same busy answer, queue included."""

    async def overloaded(req: GenerateRequest) -> PrefillResult:
        raise OverloadedError("KV held for siblings is at its bound")

    monkeypatch.setattr(fake_engine, "prefill", overloaded)
    async with serve(settings, fake_engine, mode="prefill", internal_api_key="int-key") as (
        app,
        client,
    ):
        client.headers["Authorization"] = "Bearer int-key"
        body = {"request_id": "ctx-1", "prompt_token_ids": [5, 6, 7]}
        r = await client.post("/internal/v1/prefill", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
        assert r.headers["x-prefill-queue-requests"] == "1"  # itself, while it was refused
        assert state_of(app).prefill_queue.requests == 0
