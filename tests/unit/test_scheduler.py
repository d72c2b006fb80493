"""Scheduler with a real BlockManager and scripted tokens (no model): what it pins.

- chunked prefill: a prompt longer than the step's token budget (max_num_tokens) is computed in
  budget-sized chunks over several steps, and only the chunk that reaches the end samples;
- running before waiting: each step first packs the running sequences (one token per decode,
  the next chunk of an unfinished prefill), then admits waiting ones FCFS with what is left;
- admission stops at max_batch_size running sequences and at the head of the queue when its
  blocks are not free (no overtaking);
- preemption: when a running sequence needs a block and none is free, the most recently
  admitted sequence is preempted: its blocks are freed, its progress reset, and it goes back to
  the front of the queue (itself, when it is the newest: it then skips the step);
- a waiting sequence holds no blocks, so two admissible requests cannot stall each other
  (a regression: a waiting sequence used to keep the cached prefix it matched);
- the prefix cache: a second prompt with the same full blocks starts after them (always at
  least one token left to compute), is counted in prefix_queries/prefix_hits, and a request
  that wants prompt logprobs skips the cache;
- finish releases a sequence's blocks unless asked to keep them (disaggregated prefill).
"""

from __future__ import annotations

import torch

from trtllm_gateway.engine.builtin.block_manager import BlockManager
from trtllm_gateway.engine.builtin.scheduler import ScheduledChunk, Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence, Status
from trtllm_gateway.engine.protocol import SamplingParams

BS = 4


def _seq(request_id: str, prompt: list[int], sampling: SamplingParams | None = None) -> Sequence:
    return Sequence(
        request_id=request_id,
        token_ids=list(prompt),
        prompt_len=len(prompt),
        sampling=sampling or SamplingParams(),
        generator=torch.Generator(),
    )


def _scheduler(
    num_blocks: int = 64, max_batch_size: int = 8, max_num_tokens: int = 64
) -> Scheduler:
    blocks = BlockManager(num_blocks, BS, enable_prefix_caching=True)
    return Scheduler(blocks, max_batch_size, max_num_tokens)


def _step(sched: Scheduler) -> list[tuple[str, int, int]]:
    """One engine step with scripted tokens: schedule, commit, append a token where sampled."""
    chunks = sched.schedule()
    sched.commit(chunks)
    for c in chunks:
        if c.samples:
            c.seq.token_ids.append(7)
    return [(c.seq.request_id, c.start, c.length) for c in chunks]


def test_chunked_prefill_stays_within_the_token_budget() -> None:
    sched = _scheduler(max_num_tokens=8)
    a = _seq("a", list(range(20)))
    sched.add(a)
    chunks = sched.schedule()
    assert [(c.start, c.length, c.samples) for c in chunks] == [(0, 8, False)]
    sched.commit(chunks)
    assert _step(sched) == [("a", 8, 8)]
    assert a.output_len == 0  # no token sampled mid-prompt
    assert _step(sched) == [("a", 16, 4)]
    assert a.output_len == 1
    assert _step(sched) == [("a", 20, 1)]  # decode: one token per step


def test_running_sequences_go_first_then_waiting_ones_fill_the_budget() -> None:
    sched = _scheduler(max_num_tokens=10)
    a, b, c = _seq("a", list(range(4))), _seq("b", list(range(200, 230))), _seq("c", [1, 2])
    sched.add(a)
    _step(sched)  # a: prefill done, now decoding
    sched.add(b)
    sched.add(c)
    # a's decode first, then b (FCFS) gets the other 9; c waits for a later step.
    assert _step(sched) == [("a", 4, 1), ("b", 0, 9)]
    # b's unfinished prefill continues before c is admitted with the budget left over.
    assert _step(sched) == [("a", 5, 1), ("b", 9, 9)]
    assert _step(sched) == [("a", 6, 1), ("b", 18, 9)]
    assert _step(sched) == [("a", 7, 1), ("b", 27, 3), ("c", 0, 2)]


def test_admission_stops_at_max_batch_size() -> None:
    sched = _scheduler(max_batch_size=2)
    seqs = [_seq(str(i), [1, 2, 3]) for i in range(3)]
    for s in seqs:
        sched.add(s)
    assert [rid for rid, _, _ in _step(sched)] == ["0", "1"]
    assert [s.status for s in seqs] == [Status.RUNNING, Status.RUNNING, Status.WAITING]
    sched.finish(seqs[0])
    assert [rid for rid, _, _ in _step(sched)] == ["1", "2"]


def test_head_of_line_waits_for_blocks_and_nothing_overtakes_it() -> None:
    sched = _scheduler(num_blocks=3)
    a = _seq("a", list(range(8)))  # 2 blocks
    sched.add(a)
    _step(sched)
    big, small = _seq("big", list(range(8))), _seq("small", [1])
    sched.add(big)  # needs 2 blocks, 1 free
    sched.add(small)  # would fit, but waits behind big
    assert _step(sched) == [("a", 8, 1)]
    assert big.status is Status.WAITING and small.status is Status.WAITING
    assert list(sched.waiting) == [big, small]


def test_preemption_evicts_the_newest_running_sequence_and_frees_its_blocks() -> None:
    sched = _scheduler(num_blocks=4)
    sched.blocks.caching = False  # so the victim's freed blocks are not found again
    a, b = _seq("a", list(range(8))), _seq("b", list(range(100, 108)))
    sched.add(a)
    sched.add(b)
    _step(sched)  # both prefilled: 2 full blocks each, plus a sampled token
    assert sched.blocks.num_free == 0
    # Each decode now needs a third block: a (older) gets it by preempting b (newest).
    assert _step(sched) == [("a", 8, 1)]
    assert b.status is Status.WAITING and b.block_table == [] and b.num_computed == 0
    assert b.preemptions == 1 and sched.preemptions == 1
    assert sched.running == [a] and list(sched.waiting) == [b]
    assert len(a.block_table) == 3 and sched.blocks.num_free == 1
    # b keeps its generated token: it is recomputed with its prompt once blocks free up.
    assert b.num_tokens == 9
    sched.finish(a)
    assert _step(sched) == [("b", 0, 9)]


def test_a_preempted_sequence_waits_without_blocks_and_finds_its_prefix_again() -> None:
    """With prefix caching, the victim's first block stays cached after preemption; while it
    waits it holds nothing (so it cannot pin blocks nobody may preempt), and once admitted it
    starts after that block."""
    sched = _scheduler(num_blocks=4)
    a, b = _seq("a", list(range(8))), _seq("b", list(range(100, 108)))
    sched.add(a)
    sched.add(b)
    _step(sched)
    b_first = b.block_table[0]
    assert _step(sched) == [("a", 8, 1)]
    assert b.status is Status.WAITING and b.block_table == [] and b.num_computed == 0
    assert sched.blocks.num_free == 1
    sched.finish(a)
    assert _step(sched) == [("b", 4, 5)]
    assert b.block_table[0] == b_first and b.num_cached == 0  # counted once, when first admitted


def test_a_sequence_that_is_itself_the_newest_preempts_itself() -> None:
    sched = _scheduler(num_blocks=3)
    sched.blocks.caching = False
    b, a = _seq("b", [1]), _seq("a", list(range(8)))
    sched.add(b)
    sched.add(a)  # admitted after b: the newest
    _step(sched)  # b: 1 block, a: 2 full blocks and a sampled token; none free
    # a's decode needs a third block: a itself is the victim and skips the step; b goes on.
    assert _step(sched) == [("b", 1, 1)]
    assert a.status is Status.WAITING and a.block_table == [] and a.preemptions == 1
    assert sched.running == [b] and sched.blocks.num_free == 2


def test_waiting_sequences_holding_cached_blocks_cannot_stall_the_engine() -> None:
    # Both requests pass the engine's admission rule: prompt + max_tokens fit in the cache.
    sched = _scheduler(num_blocks=4)
    a, b = _seq("a", list(range(8))), _seq("b", list(range(100, 108)))
    assert sched.blocks.blocks_needed(8 + 8) <= sched.blocks.num_blocks
    sched.add(a)
    sched.add(b)
    for _ in range(40):
        if not sched.has_work():
            break
        _step(sched)
        for s in (a, b):
            if s.output_len >= 8 and s.status is Status.RUNNING:
                sched.finish(s)
    assert a.output_len >= 8 and b.output_len >= 8


def test_a_shared_prefix_is_served_from_the_cache() -> None:
    sched = _scheduler()
    shared = list(range(100, 108))  # two full blocks
    a = _seq("a", [*shared, 1, 2])
    sched.add(a)
    _step(sched)
    b = _seq("b", [*shared, 3])
    sched.add(b)
    steps = _step(sched)
    assert ("b", 8, 1) in steps  # only the uncached tail is computed
    assert b.block_table[:2] == a.block_table[:2]
    assert b.num_cached == 8
    assert sched.prefix_queries == 10 + 9 and sched.prefix_hits == 8
    assert sched.cached_prefix_tokens([*shared, 5]) == 8


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    sched = _scheduler()
    prompt = list(range(8))
    a = _seq("a", prompt)
    sched.add(a)
    _step(sched)
    b = _seq("b", prompt)
    sched.add(b)
    assert ("b", 4, 4) in _step(sched)  # the block holding the last token is recomputed
    assert sched.cached_prefix_tokens(prompt) == 4


def test_prompt_logprobs_skip_the_prefix_cache() -> None:
    sched = _scheduler()
    shared = list(range(100, 108))
    sched.add(_seq("a", [*shared, 1]))
    _step(sched)
    b = _seq("b", [*shared, 2], SamplingParams(prompt_logprobs=1))
    sched.add(b)
    assert ("b", 0, 9) in _step(sched)
    assert b.num_cached == 0


def test_finish_releases_blocks_unless_kept() -> None:
    sched = _scheduler(num_blocks=8)
    a, b = _seq("a", list(range(6))), _seq("b", list(range(50, 56)))
    sched.add(a)
    sched.add(b)
    _step(sched)
    assert sched.blocks.num_free == 4
    sched.finish(a)
    assert a.status is Status.FINISHED and a.block_table == [] and sched.blocks.num_free == 6
    sched.finish(b, keep_blocks=True)  # a prefill-side sequence kept for a sibling to pull
    assert sched.running == [] and len(b.block_table) == 2 and sched.blocks.num_free == 6
    sched.release(b)
    assert sched.blocks.num_free == 8 and not sched.has_work()


def test_a_chunk_samples_only_when_it_reaches_the_end() -> None:
    seq = _seq("a", list(range(10)))
    assert not ScheduledChunk(seq, 0, 9).samples
    assert ScheduledChunk(seq, 4, 6).samples
