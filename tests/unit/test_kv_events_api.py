"""/internal/v1/kv-events and /internal/v1/load in process: NDJSON content, resume, resync, 404."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from pydantic import SecretStr

from tests.conftest import wait_ready
from tests.fake_engine import FakeEngine
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.kv_events.log import BlockRemoved, BlockStored, KvEventLog
from trtllm_gateway.engine.protocol import EngineInfo

AUTH = {"Authorization": "Bearer int-key"}  # the internal key: /internal/ takes nothing else


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"internal_api_key": SecretStr("int-key")})


@pytest.fixture
def client(client: httpx.AsyncClient) -> httpx.AsyncClient:
    client.headers.update(AUTH)
    return client


class EventFakeEngine(FakeEngine):
    """The fake engine with a KV event log (a KvEventSource) the test writes to."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.kv_event_log = KvEventLog(block_size=4, num_blocks=64, capacity=3)


@pytest.fixture
async def events_client(
    settings: Settings, engine_info: EngineInfo, reply_ids: list[int], tokenizer_dir: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, KvEventLog]]:
    engine = EventFakeEngine(engine_info, reply_ids, tokenizer_dir=tokenizer_dir)
    app = create_app(settings.parts(), engine=engine)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=AUTH
        ) as client:
            await wait_ready(client)
            yield client, engine.kv_event_log


async def _lines(client: httpx.AsyncClient, **params: object) -> list[dict[str, object]]:
    r = await client.get("/internal/v1/kv-events", params={"follow": "false", **params})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in r.text.splitlines()]


async def test_stream_resume_and_resync(
    events_client: tuple[httpx.AsyncClient, KvEventLog],
) -> None:
    client, log = events_client
    log.append(BlockStored((11,), None, (1, 2, 3, 4), 4))
    log.append(BlockStored((12,), 11, (5, 6, 7, 8), 4))
    lines = await _lines(client)
    assert lines[0] == {
        "type": "Hello", "instance": log.instance, "block_size": 4, "num_blocks": 64, "next_id": 2,
    }  # fmt: skip
    assert [(x["event_id"], x["block_hashes"], x["parent_block_hash"]) for x in lines[1:]] == [
        (0, [11], None),
        (1, [12], 11),
    ]
    assert (await _lines(client, after=0))[1]["event_id"] == 1  # resume after id 0
    r = await client.get(
        "/internal/v1/kv-events", params={"follow": "false"}, headers={"Last-Event-ID": "1"}
    )
    assert r.text.count("\n") == 1  # only the Hello: nothing after id 1
    for h in (13, 14):
        log.append(BlockRemoved((h,)))  # capacity 3: id 0 is dropped
    lines = await _lines(client)
    assert [x["type"] for x in lines] == [
        "Hello",
        "Resync",
        "BlockStored",
        "BlockRemoved",
        "BlockRemoved",
    ]
    assert lines[2]["event_id"] == 1


async def test_load(events_client: tuple[httpx.AsyncClient, KvEventLog]) -> None:
    client, _ = events_client
    body = (await client.get("/internal/v1/load")).json()
    assert body["state"] == "ready" and body["kv_blocks_total"] == 64
    assert {"running", "waiting", "kv_usage", "kv_blocks_used", "in_flight", "queued"} <= set(body)
    assert body["kv_active_blocks"] == body["kv_blocks_used"] and body["data_parallel_rank"] == 0


async def test_bad_after_is_a_400(events_client: tuple[httpx.AsyncClient, KvEventLog]) -> None:
    client, _ = events_client
    r = await client.get("/internal/v1/kv-events", params={"after": "-5"})
    assert r.status_code == 400 and "after" in r.json()["error"]["param"]


async def test_engine_without_events_is_a_404(client: httpx.AsyncClient) -> None:
    r = await client.get("/internal/v1/kv-events")
    assert r.status_code == 404 and "KV events" in r.json()["error"]["message"]
    body = (await client.get("/internal/v1/load")).json()
    assert body["kv_blocks_total"] == 0 and body["state"] == "ready"


async def test_token_ids_only_when_asked(
    events_client: tuple[httpx.AsyncClient, KvEventLog],
) -> None:
    """Issue 24: a stored block's tokens are a user's prompt; the stream carries its hashes, and
    the tokens only for a holder of the internal key that asks (the KV-routing follower)."""
    client, log = events_client
    log.append(BlockStored((11,), None, (1, 2, 3, 4), 4))
    (stored,) = (await _lines(client))[1:]
    assert stored["block_hashes"] == [11] and "token_ids" not in stored
    (stored,) = (await _lines(client, token_ids="true"))[1:]
    assert stored["token_ids"] == [1, 2, 3, 4]
