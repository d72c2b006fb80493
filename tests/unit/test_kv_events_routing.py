"""KV-aware sibling choice: the prefix index, the cost function, prefill pools, the follower."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import ValidationError

from tests.fake_engine import FakeEngine
from trtllm_gateway.config.prefill_pools import parse_prefill_pools, pool_for
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.disagg import kv_follow
from trtllm_gateway.engine.disagg.kv_follow import KvFollower
from trtllm_gateway.engine.disagg.prefix_index import PrefixIndex
from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine
from trtllm_gateway.engine.disagg.siblings import SiblingPool
from trtllm_gateway.engine.kv_events.log import AllBlocksCleared, BlockRemoved, BlockStored
from trtllm_gateway.engine.protocol import EngineInfo, GenerateRequest, SamplingParams
from trtllm_gateway.engine.stats import RemotePrefillStats

BS = 4
PROMPT = tuple(range(100, 120))  # five full blocks


def _store(index: PrefixIndex, tokens: tuple[int, ...], first_hash: int = 1) -> list[int]:
    """Store the full blocks of `tokens` as one event; returns their hashes."""
    n = len(tokens) // BS
    hashes = list(range(first_hash, first_hash + n))
    index.apply(BlockStored(tuple(hashes), None, tokens[: n * BS], BS))
    return hashes


def test_index_matches_leading_blocks_only() -> None:
    index = PrefixIndex()
    assert index.cached_tokens(PROMPT) == 0
    hashes = _store(index, PROMPT[:12])
    assert index.cached_tokens(PROMPT) == 12
    assert index.cached_tokens(PROMPT[:11]) == 8  # only full blocks count
    assert index.cached_tokens((0, *PROMPT)) == 0  # same tokens at another offset
    # A continuation stored later chains on the parent hash.
    index.apply(BlockStored((50,), hashes[-1], PROMPT[12:16], BS))
    assert index.cached_tokens(PROMPT) == 16
    index.apply(BlockRemoved((hashes[1],)))
    assert index.cached_tokens(PROMPT) == 4  # the chain breaks at the evicted block
    index.apply(AllBlocksCleared())
    assert index.cached_tokens(PROMPT) == 0 and len(index) == 0


def test_pick_for_prefers_the_cached_prefix_weighted_by_load() -> None:
    pool = SiblingPool(["http://a", "http://b"], backoff=5.0, load_weight=1.0)
    a, b = pool.siblings
    _store(b.kv, PROMPT[:16])
    sib, hit = pool.pick_for(PROMPT)
    assert (sib, hit) == (b, 16)
    # b is busy with 20 queued tokens: cost(b) = 4 + 20 > cost(a) = 20 + 0.
    with pool.busy(b, tokens=20):
        assert pool.pick_for(PROMPT)[0] is a
    # Nobody holds this prompt: least outstanding, as without KV routing.
    with pool.busy(a, tokens=1):
        sib, hit = pool.pick_for(tuple(range(500, 520)))
    assert (sib, hit) == (b, 0)
    assert pool.kv_stats.choices == {"prefix": 2, "load": 1}
    assert pool.kv_stats.prefix_hit_tokens["http://b"] == 16
    assert pool.kv_stats.drain_hits() == [16, 0, 0] and pool.kv_stats.hits == []
    # An unhealthy sibling is not chosen however much it holds.
    pool.mark(b, healthy=False)
    assert pool.pick_for(PROMPT)[0] is a


def test_prefill_pools() -> None:
    urls = ["http://a", "http://b", "http://c"]
    pools = parse_prefill_pools("0-1024=http://a, http://b/ ; 1024-=http://c", urls)
    assert [(p.low, p.high, p.urls) for p in pools] == [
        (0, 1024, ("http://a", "http://b")),
        (1024, None, ("http://c",)),
    ]
    assert pool_for(pools, 1023) is pools[0] and pool_for(pools, 5000) is pools[1]
    assert pool_for(parse_prefill_pools("100-200=http://a"), 50) is None
    for bad, message in [
        ("0-10", "LOW-HIGH=URL"),
        ("x-10=http://a", "token counts"),
        ("10-5=http://a", "LOW < HIGH"),
        ("0-=http://a;5-9=http://b", "overlap"),
        ("0-10=http://zzz", "not in --prefill-url"),
        (" ; ", "no pool"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_prefill_pools(bad, urls)


def _ndjson(*objs: dict[str, object]) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def _stored_json(event_id: int, hashes: list[int], tokens: tuple[int, ...]) -> dict[str, object]:
    return {
        "event_id": event_id, "ts": 0.0, "type": "BlockStored", "block_hashes": hashes,
        "parent_block_hash": None, "token_ids": list(tokens), "block_size": BS, "lora_id": None,
    }  # fmt: skip


async def test_follower_resumes_resyncs_and_notices_a_restart() -> None:
    seen: list[tuple[str, str | None]] = []
    streams = [
        _ndjson(
            {"type": "Hello", "instance": "one"},
            _stored_json(0, [1, 2], PROMPT[:8]),
            {"type": "Heartbeat", "next_id": 1},
        ),
        _ndjson({"type": "Hello", "instance": "one"}, {"type": "Resync"}),
        _ndjson({"type": "Hello", "instance": "two"}),  # restarted: read it from the start
        _ndjson({"type": "Hello", "instance": "two"}, _stored_json(0, [9], PROMPT[:4])),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.params["after"], request.headers.get("authorization")))
        body = streams[len(seen) - 1] if len(seen) <= len(streams) else b""
        return httpx.Response(200 if body else 404, content=body)

    index = PrefixIndex()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        follower = KvFollower("http://p", index, client, {"Authorization": "Bearer k"}, retry=0)
        follower.start()
        for _ in range(200):
            if len(seen) > len(streams):
                break
            await asyncio.sleep(0.01)
        await follower.stop()
    assert [after for after, _ in seen[:4]] == ["-1", "0", "0", "-1"]
    assert all(auth == "Bearer k" for _, auth in seen)
    assert follower.instance == "two" and follower.last_id == 0
    assert index.cached_tokens(PROMPT) == 4  # instance one's blocks were dropped


def _siblings_transport(events: dict[str, bytes]) -> tuple[httpx.MockTransport, list[str]]:
    """Scripted prefill siblings: /info, /prefill, and a KV event stream per host."""
    prefilled: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        if path == "/internal/v1/info":
            return httpx.Response(200, json={"protocol_version": 1, "model": "m", "kv_layout": "L"})
        if path == "/internal/v1/kv-events":
            body = events.get(host)
            return httpx.Response(200, content=body) if body else httpx.Response(404)
        if path == "/internal/v1/prefill":
            prefilled.append(host)
            disagg = {"ctx_request_id": "r", "opaque_state": "c3RhdGU="}
            return httpx.Response(
                200, json={"first_token_ids": [7], "disaggregated_params": disagg}
            )
        return httpx.Response(404)

    return httpx.MockTransport(handler), prefilled


async def _engine(transport: httpx.MockTransport, **settings: object) -> RemotePrefillEngine:
    info = EngineInfo(
        model_id="m", max_model_len=4096, vocab_size=100, eos_token_ids=(), kv_layout="L"
    )
    s = Settings(mode="decode", max_local_prefill_tokens=0, **settings).parts().disagg  # type: ignore[arg-type]
    engine = RemotePrefillEngine(
        FakeEngine(info, [5]), s, RemotePrefillStats(), transport=transport
    )
    await engine.start()
    return engine


async def _send(engine: RemotePrefillEngine, prompt: tuple[int, ...]) -> None:
    req = GenerateRequest("r", prompt, SamplingParams(max_tokens=1))
    async for _ in engine.generate(req):
        pass


async def test_remote_prefill_follows_events_to_the_cached_sibling() -> None:
    hello = {"type": "Hello", "instance": "p2"}
    transport, prefilled = _siblings_transport(
        {"p2": _ndjson(hello, _stored_json(0, [1, 2, 3], PROMPT[:12]))}
    )
    engine = await _engine(transport, prefill_url=["http://p1", "http://p2"])
    try:
        sib2 = engine.pool.siblings[1]
        for _ in range(100):
            if sib2.kv.cached_tokens(PROMPT):
                break
            await asyncio.sleep(0.01)
        for _ in range(3):  # round robin would alternate; the cached prefix wins every time
            await _send(engine, PROMPT)
        await _send(engine, tuple(range(500, 520)))  # cached nowhere: least outstanding
    finally:
        await engine.stop()
    assert prefilled[:3] == ["p2", "p2", "p2"]
    assert engine.pool.kv_stats.choices == {"prefix": 3, "load": 1}
    assert engine.pool.kv_stats.prefix_hit_tokens["http://p2"] == 36


async def test_prefill_pools_pick_the_group_by_prompt_length() -> None:
    transport, prefilled = _siblings_transport({})
    urls = ["http://p1", "http://p2", "http://p3"]
    engine = await _engine(
        transport, prefill_url=urls, prefill_pools="0-100=http://p1,http://p2;100-=http://p3"
    )
    try:
        for n in (20, 150, 30, 400, 99):
            await _send(engine, tuple(range(1, n + 1)))
    finally:
        await engine.stop()
    assert prefilled[1] == "p3" and prefilled[3] == "p3"
    assert {prefilled[0], prefilled[2], prefilled[4]} <= {"p1", "p2"}


def test_settings_refuse_bad_pools() -> None:
    with pytest.raises(ValidationError, match="not in --prefill-url"):
        Settings(prefill_url=["http://a"], prefill_pools="0-10=http://b")


async def test_an_endless_line_is_dropped_not_buffered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40, item 6: a sibling's line without end is cut at MAX_LINE_BYTES (httpx's
    aiter_lines kept buffering it); the stream is opened again."""
    monkeypatch.setattr(kv_follow, "MAX_LINE_BYTES", 1 << 20)
    sent: list[int] = []
    opened: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        yield b'{"type": "Hello", "instance": "one"}\n'
        for _ in range(64):  # 64 MiB of one line, if nobody stops reading
            sent.append(1)
            yield b"x" * (1 << 20)

    def handler(request: httpx.Request) -> httpx.Response:
        opened.append(1)
        return httpx.Response(200, content=endless())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        follower = KvFollower("http://p", PrefixIndex(), client, {}, retry=0.05)
        follower.start()
        for _ in range(200):
            if len(opened) >= 2:
                break
            await asyncio.sleep(0.01)
        await follower.stop()
    assert follower.instance == "one"
    assert len(opened) >= 2  # dropped and opened again
    assert len(sent) <= 3 * len(opened), (len(sent), len(opened))
