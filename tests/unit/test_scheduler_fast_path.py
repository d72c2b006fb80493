"""Scheduler: the whole-batch path for the running sequences packs what the loop packs.

Scheduler._schedule_all_running takes every running sequence's next chunk in a few
comprehensions when they all fit the token budget and the free blocks; otherwise the loop runs
(preemption, a budget that cuts a chunk). Two schedulers take the same random workload (prompts
of random lengths, random stops, few KV blocks so that preemption happens, a budget that chunks
prefills), one with the whole-batch path turned off: every step's chunks, every sequence's
block table and the free blocks must be equal, and both paths must have been taken.
"""

from __future__ import annotations

import random

import pytest
import torch

from trtllm_gateway.engine.builtin.block_manager import BlockManager
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.protocol import SamplingParams

BS = 4


def _run(seed: int, whole_batch: bool) -> tuple[list[object], int]:
    rng = random.Random(seed)
    sched = Scheduler(BlockManager(40, BS, enable_prefix_caching=True), 6, 24)
    taken = 0
    if not whole_batch:
        sched._schedule_all_running = lambda budget: None  # type: ignore[method-assign]
    else:
        inner = sched._schedule_all_running

        def counted(budget: int) -> object:
            nonlocal taken
            out = inner(budget)
            taken += out is not None and bool(out[0])
            return out

        sched._schedule_all_running = counted  # type: ignore[method-assign]
    log: list[object] = []
    for i in range(12):
        prompt = [rng.randrange(1, 50) for _ in range(rng.randint(1, 30))]
        sched.add(Sequence(f"r{i}", prompt, len(prompt), SamplingParams(), torch.Generator()))
    for _ in range(200):
        chunks = sched.schedule()
        sched.commit(chunks)
        log.append([(c.seq.request_id, c.start, c.length) for c in chunks])
        for c in chunks:
            if c.samples:
                c.seq.token_ids.append(rng.randrange(1, 50))
                if rng.random() < 0.08:
                    sched.finish(c.seq)
        log.append(sorted((s.request_id, tuple(s.block_table)) for s in sched.running))
        log.append(sched.blocks.num_free)
        if not sched.has_work():
            break
    log.append(sched.preemptions)
    return log, taken


@pytest.mark.parametrize("seed", range(6))
def test_the_whole_batch_path_packs_what_the_loop_packs(seed: int) -> None:
    fast, taken = _run(seed, whole_batch=True)
    slow, _ = _run(seed, whole_batch=False)
    assert fast == slow
    assert taken > 10  # the whole-batch path ran


def test_both_paths_ran_and_preemption_happened() -> None:
    preempted = [_run(seed, whole_batch=True)[0][-1] for seed in range(6)]
    assert any(p for p in preempted)  # the loop's preemption was exercised beside it
