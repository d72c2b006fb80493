"""Router-facing endpoints: the engine's KV-cache events and its load (behind the internal key).

GET /internal/v1/kv-events?after=N   NDJSON, one JSON object a line: first a Hello (instance,
                                     block size, blocks, next id), a Resync when events after
                                     N were already dropped, then every event with id > N
                                     (engine/kv_events/log.py's fields), Heartbeat lines while
                                     idle. follow=false ends after the backlog. Resume with
                                     after=<last event_id seen> (or Last-Event-ID). A
                                     BlockStored carries its token ids (users' prompts) only
                                     with token_ids=true; by default, hashes only.
GET /internal/v1/load                running, waiting, KV usage and blocks, admission
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response, StreamingResponse

from trtllm_gateway.engine.capabilities import KvEventSource
from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.kv_events.log import KvEventLog, event_json
from trtllm_gateway.web.deps import ServingDep, StateDep
from trtllm_gateway.web.errors import NotFoundError

CHUNK_EVENTS = 1000

router = APIRouter(tags=["kv-routing"], include_in_schema=False)


def _log(serving: ServingDep) -> KvEventLog:
    if not isinstance(serving.engine, KvEventSource) or not serving.engine.kv_event_log.enabled:
        raise NotFoundError(
            "this engine publishes no KV events (TensorRT-LLM needs --enable-kv-events)"
        )
    return serving.engine.kv_event_log


@router.get(wire.KV_EVENTS_PATH)
async def kv_events(
    serving: ServingDep,
    state: StateDep,
    after: Annotated[int, Query(ge=-1)] = -1,
    follow: bool = True,
    token_ids: bool = False,
    heartbeat: Annotated[float, Query(gt=0, le=60)] = 5.0,
    last_event_id: Annotated[int | None, Header(ge=-1)] = None,
) -> StreamingResponse:
    log = _log(serving)
    start = after if last_event_id is None else max(after, last_event_id)

    async def lines() -> AsyncIterator[bytes]:
        yield wire.encode_line(
            wire.Hello(
                instance=log.instance,
                block_size=log.block_size,
                num_blocks=log.num_blocks,
                next_id=log.next_id,
            )
        )
        cursor = start
        while True:
            records, lost = log.since(cursor)
            if lost:
                yield wire.encode_line(wire.Resync())  # drop what you knew of this instance
            if records:
                for i in range(0, len(records), CHUNK_EVENTS):  # a long backlog in pieces
                    chunk = records[i : i + CHUNK_EVENTS]
                    yield b"".join(wire.encode_line(event_json(r, token_ids)) for r in chunk)
                cursor = records[-1].event_id
            elif not follow:
                return
            elif state.health().state != "ready":
                return  # draining: let the server stop
            else:
                await log.wait(cursor, heartbeat)
                if log.next_id <= cursor + 1:
                    yield wire.encode_line(wire.Heartbeat(next_id=log.next_id))

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get(wire.LOAD_PATH)
async def load(serving: ServingDep, state: StateDep) -> Response:
    health = state.health()
    engine = serving.engine
    blocks = health.kv_total_blocks
    if not blocks and isinstance(engine, KvEventSource):
        blocks = engine.kv_event_log.num_blocks
    # The engine's own count of held blocks when it has one; else derived from the usage.
    used = health.kv_active_blocks if health.kv_total_blocks else round(health.kv_usage * blocks)
    report = wire.Load(
        state=health.state,
        running=health.running,
        waiting=health.waiting,
        kv_usage=health.kv_usage,
        kv_blocks_total=blocks,
        kv_blocks_used=used,
        kv_active_blocks=used,
        data_parallel_rank=state.config.engine.data_parallel_rank,
        in_flight=serving.admission.total_in_flight,
        queued=serving.admission.queued,
    )
    return Response(wire.encode(report), media_type="application/json")
