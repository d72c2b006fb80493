"""--kv-events-zmq in each --kv-events-format, read by the projects whose format it is.

The built-in engine runs the real default model with a cache small enough that blocks are
evicted; every frame is decoded with vLLM's structs or Dynamo's reader as transcribed in
tests/upstream/ (never with the gateway's own decoder), the decoded events are replayed, and the
reader must hold exactly the blocks the engine's prefix cache holds, each under the hash the
engine computes from the tokens the reader got.
"""

from __future__ import annotations

import socket
from typing import Any

import msgpack
import msgspec
import pytest
import zmq

from tests.engine.conftest import EngineFactory, collect, greedy
from tests.engine.kv_capture import TOPIC, CacheView, Capture, Frames, check_against_engine
from tests.in_thread import thread_core
from tests.upstream import (
    dynamo_trtllm_publisher,
    dynamo_zmq_wire,
    vllm_kv_events_array,
    vllm_kv_events_map,
    vllm_kv_events_subscriber,
)
from trtllm_gateway.engine.kv_events.log import BlockRemoved, BlockStored
from trtllm_gateway.engine.kv_events.wire import unsigned64
from trtllm_gateway.engine.protocol import GenerateRequest
from trtllm_gateway.engine.transport.client import CoreClient

BS = 16
SHARED = "You are a terse assistant. Answer in one short line, no preamble. " * 3


async def _run_prompts(engine: CoreClient, chat_prompts: list[list[int]]) -> None:
    # A shared system prefix (stored once, then hit), then prompts enough to evict blocks.
    for i, ids in enumerate(chat_prompts):
        req = GenerateRequest(f"p{i}", tuple(ids), greedy(4, ignore_eos=True))
        await collect(engine, req)


@pytest.fixture
def prompts(tokenizer: Any) -> list[list[int]]:
    out = []
    for q in ("Name a color.", "Name a fruit.", "Name a planet.", "Name a river.", "Count to 3."):
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": SHARED}, {"role": "user", "content": q}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def _seqs(frames: Frames) -> list[int]:
    assert all(topic == TOPIC.encode() and len(seq) == 8 for topic, seq, _ in frames)
    return [int.from_bytes(seq, "big") for _, seq, _ in frames]


def _replay_vllm(view: CacheView, events: list[Any], stored: type, removed: type) -> None:
    for ev in events:
        if isinstance(ev, stored):
            keys = getattr(ev, "extra_keys", None) or [None] * len(ev.block_hashes)
            extra = [b"".join(str(k[0]).encode() for k in ks or ()) for ks in keys]
            view.stored(ev.block_hashes, ev.parent_block_hash, ev.token_ids, extra)
        elif isinstance(ev, removed):
            view.removed(ev.block_hashes)
        else:
            view.cleared()


async def test_every_format_decodes_with_its_readers_into_the_engines_cache(
    make_engine: EngineFactory, prompts: list[list[int]]
) -> None:
    # Room for the longest prompt and two blocks more: the five cannot all stay cached.
    blocks = max(len(p) for p in prompts) // BS + 3
    engine = await make_engine(num_kv_blocks=blocks, block_size=BS, max_num_tokens=256)
    async with Capture(engine, ("vllm", "vllm-array", "dynamo"), replay=True) as cap:
        await _run_prompts(engine, prompts)
        frames = {fmt: await cap.frames(fmt) for fmt in cap.formats}
        records, _ = engine.kv_event_log.since(-1)
        replay_address = cap.publishers["vllm"].replay_addresses[0]

        # vLLM now: KVEventBatch maps, unsigned hashes, one sequence from 0, rank 0.
        view = CacheView(BS)
        decoder = msgspec.msgpack.Decoder(type=vllm_kv_events_map.KVEventBatch)
        for _, _, payload in frames["vllm"]:
            batch = decoder.decode(payload)
            assert batch.data_parallel_rank == 0
            for ev in batch.events:
                if isinstance(ev, vllm_kv_events_map.BlockStored | vllm_kv_events_map.BlockRemoved):
                    assert ev.medium == "GPU"
            m = vllm_kv_events_map
            _replay_vllm(view, batch.events, m.BlockStored, m.BlockRemoved)
        assert _seqs(frames["vllm"]) == list(range(len(frames["vllm"])))
        kinds = {type(e.event) for e in records}
        assert BlockRemoved in kinds and BlockStored in kinds  # evictions happened
        assert check_against_engine(view, engine, "vllm") >= 4
        # Cached is not held: idle, no block is active (/metrics kv_active_blocks, /load).
        health = thread_core(engine).health()
        assert health.kv_active_blocks == 0 and health.kv_total_blocks == blocks

        # vLLM's first array_like structs and its example subscriber read the array layout.
        for structs in (vllm_kv_events_array, vllm_kv_events_subscriber):
            view = CacheView(BS)
            decoder = msgspec.msgpack.Decoder(type=structs.KVEventBatch)
            for _, _, payload in frames["vllm-array"]:
                batch = decoder.decode(payload)
                _replay_vllm(view, batch.events, structs.BlockStored, structs.BlockRemoved)
            check_against_engine(view, engine, "vllm-array")
        assert _seqs(frames["vllm-array"]) == list(range(len(frames["vllm-array"])))

        # Dynamo: its reader's rules, one event a message, and the very bytes its publisher packs.
        view = CacheView(BS)
        stored = [r for r in records if not isinstance(r.event, BlockRemoved)][-1:]
        assert stored
        for _, _, payload in frames["dynamo"]:
            batch = dynamo_zmq_wire.decode_batch(payload)
            assert batch.data_parallel_rank == 0 and len(batch.events) == 1
            ev = batch.events[0]
            if ev.type == "BlockStored":
                assert ev.block_mm_infos == [None] * len(ev.block_hashes)  # text: no images
                hashes = [h - (1 << 64) if h >= 1 << 63 else h for h in ev.block_hashes]
                parent = ev.parent_block_hash
                if parent is not None and parent >= 1 << 63:
                    parent -= 1 << 64
                assert ev.token_ids is not None
                view.stored(hashes, parent, ev.token_ids, [b""] * len(hashes))
            elif ev.type == "BlockRemoved":
                view.removed([h - (1 << 64) if h >= 1 << 63 else h for h in ev.block_hashes])
            else:
                view.cleared()
        assert _seqs(frames["dynamo"]) == list(range(len(frames["dynamo"])))
        check_against_engine(view, engine, "dynamo")
        _same_bytes_as_dynamos_publisher(frames["dynamo"], records)

        # vLLM's replay: a request for batches from sequence 1 gets each back, then the end
        # marker. (A REQ socket, as in vLLM's example subscriber, reads the first reply only;
        # a DEALER sends the same envelope and reads them all.)
        req = cap.ctx.socket(zmq.DEALER)
        req.connect(replay_address)
        req.send_multipart([b"", (1).to_bytes(8, "big")])
        replayed = []
        while req.poll(5000):
            empty, seq, payload = req.recv_multipart()
            assert empty == b""
            if not payload:
                assert seq == vllm_kv_events_map.END_SEQ
                break
            replayed.append((int.from_bytes(seq, "big"), payload))
        req.close(linger=0)
        assert replayed == [(int.from_bytes(s, "big"), p) for _, s, p in frames["vllm"]][1:]


def _same_bytes_as_dynamos_publisher(frames: Frames, records: list[Any]) -> None:
    """Each frame is byte for byte what publisher.py packs for that event (its ts taken from
    the frame: the publisher stamps time.time() when it sends)."""
    by_ts = {}
    for _, _, payload in frames:
        ts = msgpack.unpackb(payload)[0]
        by_ts.setdefault(ts, []).append(payload)
    pub = dynamo_trtllm_publisher
    checked = 0
    for rec in records:
        ev = rec.event
        if rec.ts not in by_ts:
            continue  # before the subscription (the start-up AllBlocksCleared)
        if isinstance(ev, BlockStored):
            parent = ev.parent_block_hash
            event = pub.stored_event(
                list(ev.token_ids),
                [unsigned64(h) for h in ev.block_hashes],
                ev.block_size,
                0,
                None if parent is None else unsigned64(parent),
                [None] * len(ev.block_hashes),
            )
        elif isinstance(ev, BlockRemoved):
            event = pub.removed_event([unsigned64(h) for h in ev.block_hashes])
        else:
            event = pub.all_cleared_event()
        assert pub.payload(rec.ts, event, ev.dp_rank) in by_ts[rec.ts]
        checked += 1
    assert checked == len(frames)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_data_parallel_rank_is_named_and_offsets_vllms_port(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    """--data-parallel-rank 2: every event names rank 2; vLLM's publisher for rank 2 binds
    its port + 2 (offset_endpoint_port), Dynamo's socket stays where it was asked to be."""
    engine = await make_engine(num_kv_blocks=64, data_parallel_rank=2)
    port = _free_port()
    cap = Capture(engine, ("vllm",), rank=2, address=f"tcp://127.0.0.1:{port - 2}")
    cap.address = f"tcp://*:{port - 2}"
    async with cap:
        assert cap.publishers["vllm"].address.endswith(f":{port}")
        await collect(engine, GenerateRequest("r", tuple(chat_prompts[0]), greedy(2)))
        frames = await cap.frames("vllm")
    decoder = msgspec.msgpack.Decoder(type=vllm_kv_events_map.KVEventBatch)
    assert frames and {decoder.decode(p).data_parallel_rank for _, _, p in frames} == {2}
    records, _ = engine.kv_event_log.since(-1)
    assert {r.event.dp_rank for r in records} == {2}
    async with Capture(engine, ("dynamo",), rank=2) as cap:
        await collect(engine, GenerateRequest("r2", tuple(chat_prompts[1]), greedy(2)))
        frames = await cap.frames("dynamo")
    assert frames
    assert {dynamo_zmq_wire.decode_batch(p).data_parallel_rank for _, _, p in frames} == {2}
