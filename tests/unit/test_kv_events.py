"""KV events: the built-in block manager's stream after a scripted scheduler run, and the log."""

from __future__ import annotations

import asyncio

import torch

from trtllm_gateway.engine.builtin.block_manager import BlockManager
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.kv_events.log import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
    KvEventLog,
    MmSpan,
    event_from_json,
    event_json,
    signed64,
)
from trtllm_gateway.engine.protocol import EngineHealth, SamplingParams
from trtllm_gateway.engine.transport import messages as m

BS = 4


def _seq(request_id: str, prompt: list[int]) -> Sequence:
    return Sequence(
        request_id=request_id,
        token_ids=list(prompt),
        prompt_len=len(prompt),
        sampling=SamplingParams(max_tokens=4),
        generator=torch.Generator(),
    )


def _run(sched: Scheduler, seq: Sequence, new_tokens: int) -> None:
    """Drive one sequence to completion the way the stepper does, with scripted tokens."""
    sched.add(seq)
    for t in range(new_tokens):
        chunks = sched.schedule()
        sched.commit(chunks)
        seq.token_ids.append(900 + t)
    sched.finish(seq)


def _replay(log: KvEventLog) -> dict[int, BlockStored]:
    """What a router knows after reading the whole stream: hash -> the event that stored it."""
    known: dict[int, BlockStored] = {}
    records, lost = log.since(-1)
    assert not lost
    for rec in records:
        ev = rec.event
        if isinstance(ev, AllBlocksCleared):
            known.clear()
        elif isinstance(ev, BlockStored):
            assert len(ev.token_ids) == len(ev.block_hashes) * ev.block_size
            for h in ev.block_hashes:
                known[h] = ev
        else:
            for h in ev.block_hashes:
                del known[h]  # a removed hash was stored before
    return known


def test_stream_matches_the_block_manager_after_a_scripted_run() -> None:
    blocks = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    log = KvEventLog(BS, blocks.num_blocks)
    blocks.events = log
    blocks.clear_cache()
    sched = Scheduler(blocks, max_batch_size=4, max_num_tokens=64)
    shared = list(range(100, 108))  # two full blocks
    a = _seq("a", [*shared, 1, 2, 3, 4, 5])
    _run(sched, a, 3)
    b = _seq("b", [*shared, 7, 7])  # reuses a's two blocks
    _run(sched, b, 2)
    c = _seq("c", list(range(200, 220)))  # 5 blocks + 1 token: evicts some of a's and b's
    _run(sched, c, 4)

    known = _replay(log)
    assert set(known) == {signed64(h) for h in blocks.cached}
    # Every stored event names its block's tokens and chains to its parent's hash.
    for block, h in enumerate(blocks.hash_of):
        if h is None or blocks.cached.get(h) != block:
            continue
        ev = known[signed64(h)]
        assert ev.block_size == BS and ev.lora_id is None
    # a's prompt filled three blocks in its first step: one event for the three (as vLLM's
    # block pool publishes a request's new blocks), chained from no parent.
    first = next(r.event for r in log.since(-1)[0] if isinstance(r.event, BlockStored))
    assert first.parent_block_hash is None and len(first.block_hashes) == 3
    assert first.token_ids == (*shared, 1, 2, 3, 4)
    # b found a's blocks: nothing stored twice for the shared prefix.
    stored = [
        h
        for r in log.since(-1)[0]
        if isinstance(r.event, BlockStored)
        for h in r.event.block_hashes
    ]
    assert len(stored) == len(set(stored))
    assert any(isinstance(r.event, BlockRemoved) for r in log.since(-1)[0])
    assert isinstance(log.since(-1)[0][0].event, AllBlocksCleared)


def test_a_block_filled_by_a_decode_chains_to_the_prompts_last() -> None:
    blocks = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    blocks.events = log = KvEventLog(BS, blocks.num_blocks)
    _run(Scheduler(blocks, 4, 64), _seq("a", list(range(100, 110))), 7)
    stored = [r.event for r in log.since(-1)[0] if isinstance(r.event, BlockStored)]
    assert [len(ev.block_hashes) for ev in stored] == [2, 1, 1]
    assert stored[0].parent_block_hash is None
    assert stored[1].parent_block_hash == stored[0].block_hashes[-1]
    assert stored[1].token_ids == (108, 109, 900, 901)
    assert stored[2].parent_block_hash == stored[1].block_hashes[0]
    assert stored[2].token_ids == (902, 903, 904, 905)
    # The chain is the block manager's own: each hash is the block's chained hash.
    assert [h for ev in stored for h in ev.block_hashes] == [
        signed64(blocks.hash_of[b]) for b in range(4) if blocks.hash_of[b] is not None
    ]


def test_a_run_ends_at_a_block_another_holds() -> None:
    """register_run over four blocks whose second hash another block already holds: that block
    is not stored (its hash names the other one), so its neighbours are two events, the second
    chained to the hash it skipped."""
    blocks = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    blocks.events = log = KvEventLog(2, blocks.num_blocks)
    h = [bytes([i]) * 16 for i in range(4)]
    blocks.register(7, h[1], h[0], (3, 4))
    blocks.register_run([0, 1, 2, 3], h, None, list(range(1, 9)))
    ev = [r.event for r in log.since(-1)[0]]
    assert len(ev) == 3 and all(isinstance(e, BlockStored) for e in ev)
    assert ev[1] == BlockStored((signed64(h[0]),), None, (1, 2), 2)
    assert ev[2] == BlockStored((signed64(h[2]), signed64(h[3])), signed64(h[1]), (5, 6, 7, 8), 2)
    assert blocks.cached[h[1]] == 7 and blocks.hash_of[1] == h[1]


def test_no_events_without_prefix_caching() -> None:
    blocks = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    blocks.events = log = KvEventLog(BS)
    _run(Scheduler(blocks, 4, 64), _seq("a", list(range(12))), 2)
    assert log.since(-1) == ([], False)


def test_signed64() -> None:
    assert signed64(2**64 - 1) == -1
    assert signed64(5) == 5
    assert signed64(2**63) == -(2**63)
    assert signed64(b"\xff" * 8 + b"\x00" * 8) == -1


def test_json_round_trip() -> None:
    log = KvEventLog(4)
    events: list[KvCacheEvent] = [
        BlockStored((1, -2), None, (1, 2, 3, 4, 5, 6, 7, 8), 4),
        BlockRemoved((-2,)),
        AllBlocksCleared(),
    ]
    for ev in events:
        log.append(ev)
    records, _ = log.since(-1)
    lines = [event_json(r) for r in records]
    assert [x["event_id"] for x in lines] == [0, 1, 2]
    assert lines[0]["type"] == "BlockStored" and lines[0]["parent_block_hash"] is None
    assert [event_from_json(x) for x in lines] == events


def test_events_cross_the_core_pipe_as_they_are() -> None:
    """OutputBatch carries the events as tagged arrays; the client's log numbers a batch's
    events in order (KvEventLog.extend), as one append each would."""
    events: list[KvCacheEvent] = [
        AllBlocksCleared(dp_rank=1),
        BlockStored((1, -2), None, (1, 2, 3, 4, 5, 6, 7, 8), 4, None, 1),
        BlockStored((3,), -2, (9, 9, 9, 9), 4, 7, 0, ((MmSpan("ab" * 32, 1, 3),),)),
        BlockRemoved((-2, 3), dp_rank=1),
    ]
    batch = m.OutputBatch([], [], EngineHealth(state="ready"), events)
    got = m.decode_outbound(m.encode(batch))
    assert isinstance(got, m.OutputBatch) and got.kv_events == events
    assert [type(e) for e in got.kv_events] == [type(e) for e in events]
    log, one_by_one = KvEventLog(4), KvEventLog(4)
    log.append(BlockRemoved((5,)))
    log.extend(got.kv_events)
    log.extend([])
    for ev in [BlockRemoved((5,)), *events]:
        one_by_one.append(ev)
    records, _ = log.since(-1)
    assert [(r.event_id, r.event) for r in records] == [
        (r.event_id, r.event) for r in one_by_one.since(-1)[0]
    ]
    assert log.next_id == 5
    assert [event_from_json(event_json(r)) for r in records[1:]] == events


def test_log_resume_loss_and_wait() -> None:
    log = KvEventLog(4, capacity=3)
    for i in range(5):
        log.append(BlockRemoved((i,)))
    records, lost = log.since(3)
    assert [r.event_id for r in records] == [4] and not lost
    records, lost = log.since(-1)  # ids 0 and 1 were dropped
    assert [r.event_id for r in records] == [2, 3, 4] and lost
    assert log.since(4) == ([], False)

    async def waiting() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        loop.call_later(0.05, log.append, AllBlocksCleared())
        await log.wait(4, 5.0)
        return loop.time() - t0

    assert asyncio.run(waiting()) < 1.0
    assert log.next_id == 6
