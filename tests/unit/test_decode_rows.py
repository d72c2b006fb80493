"""The steady step (Scheduler.schedule_decodes, StepBatch.of_decodes, commit_decodes): a step in
which every running sequence decodes, as in the step before, is packed from arrays kept across
steps instead of a ScheduledChunk a row. It must be the general path's step exactly.

Twin steppers on the tiny CPU model take one random workload (prompts of random lengths,
greedy, seeded and penalized rows, logprobs, stop tokens, late arrivals, aborts, few KV blocks so
that preemption happens, the prefix cache on), one with the steady path turned off
(Scheduler.steady_steps): every step's events, every batch the backend is handed (ids,
positions, slots, block tables, sampled rows), the block tables, the free blocks and the prefix
cache's contents must be equal, at depth 0 and 1, and the steady path must have been taken,
also across a sequence leaving the run or joining it.
"""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from tests.unit.test_stepper import VOCAB, Recording, plain_stepper, seq_for, tiny_model
from trtllm_gateway.engine.builtin.decode_tables import DecodeTables
from trtllm_gateway.engine.builtin.scheduler import DecodeRows, ScheduledChunk
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.stepper import Stepper
from trtllm_gateway.engine.protocol import SamplingParams, TokenEvent


def _sampling(rng: random.Random) -> SamplingParams:
    kind = rng.random()
    common = {"max_tokens": rng.randint(1, 40), "ignore_eos": rng.random() < 0.7}
    if kind < 0.5:
        return SamplingParams(temperature=0.0, **common)  # type: ignore[arg-type]
    if kind < 0.7:
        return SamplingParams(temperature=0.8, seed=rng.randrange(1000), **common)  # type: ignore[arg-type]
    if kind < 0.8:
        return SamplingParams(temperature=0.0, logprobs=2, **common)  # type: ignore[arg-type]
    if kind < 0.9:
        return SamplingParams(temperature=0.0, repetition_penalty=1.3, **common)  # type: ignore[arg-type]
    stop = (rng.randrange(VOCAB - 1),)
    return SamplingParams(temperature=0.0, stop_token_ids=stop, **common)  # type: ignore[arg-type]


def _workload(seed: int) -> tuple[list[Sequence], dict[int, list[Sequence]], dict[int, str]]:
    rng = random.Random(seed)
    shared = [rng.randrange(VOCAB - 1) for _ in range(20)]  # some prompts share a prefix

    def one(i: int) -> Sequence:
        head = shared[: rng.choice([0, 16, 20])]
        tail = [rng.randrange(VOCAB - 1) for _ in range(rng.randint(1, 30))]
        return seq_for(f"r{i}", head + tail, _sampling(rng))

    first = [one(i) for i in range(6)]
    late: dict[int, list[Sequence]] = {}
    for i in range(6, 14):
        late.setdefault(rng.randrange(1, 60), []).append(one(i))
    aborts = {rng.randrange(3, 50): f"r{rng.randrange(10)}" for _ in range(3)}
    return first, late, aborts


def _run(
    tmp_path: Path, seed: int, depth: int, steady: bool, blocks: int
) -> tuple[list[object], tuple[int, int]]:
    lm = tiny_model(tmp_path, num_kv_blocks=blocks, enable_prefix_caching=True)
    st: Stepper = plain_stepper(lm, max_batch_size=6, max_num_tokens=48, depth=depth)
    st.scheduler.steady_steps = steady
    runner = Recording(st.pipeline.backend)
    st.pipeline.backend = runner
    first, late, aborts = _workload(seed)
    for s in first:
        st.add(s)
    log: list[object] = []
    for step in range(400):
        for s in late.pop(step, []):
            log.append(st.add(s))
        if step in aborts:
            log.append([(rid, _event(ev)) for rid, ev in st.abort(aborts[step])])
        if not st.scheduler.has_work() and not late:
            break
        log.append([(rid, _event(ev)) for rid, ev in st.step()])
        log.append(sorted((s.request_id, tuple(s.block_table)) for s in st.scheduler.running))
        log.append((lm.blocks.num_free, sorted(lm.blocks.cached.items())))
    assert not st.scheduler.has_work(), "the requests did not finish"
    for b in runner.batches:
        log.append(_batch(b))
    rows = [b.decode_rows for b in runner.batches]
    # steady steps, and those right after a steady step with other rows: a run that went on
    # across a sequence leaving or joining it, with no general step between
    steady = (
        sum(r is not None for r in rows),
        sum(a is not None and b is not None and a.seqs is not b.seqs for a, b in pairwise(rows)),
    )
    log.append(st.scheduler.preemptions)
    return log, steady


def _event(ev: object) -> object:
    if not isinstance(ev, TokenEvent):
        return repr(ev)
    lps = (
        None if ev.logprobs is None else [(lp.token_id, round(lp.logprob, 4)) for lp in ev.logprobs]
    )
    return (ev.token_ids, lps, ev.finish_reason, ev.usage)


def _batch(b: StepBatch) -> object:
    return (
        b.token_ids.tolist(),
        b.positions.tolist(),
        b.slots.tolist(),
        b.num_decodes,
        b.decode_tables.tolist(),
        b.sample_rows.tolist(),
        [s.request_id for s in b.sample_seqs],
        [(c.seq.request_id, c.start, c.length) for c in b.chunks],
        b.num_chunks,
        b.placeholders,
    )


@pytest.mark.parametrize("depth", [0, 1])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_steady_step_is_the_general_step(tmp_path: Path, depth: int, seed: int) -> None:
    general, none = _run(tmp_path, seed, depth, steady=False, blocks=20)
    steady, (taken, continued) = _run(tmp_path, seed, depth, steady=True, blocks=20)
    assert none == (0, 0)
    assert taken > 10, "the steady path was hardly taken"
    assert continued > 0, "no run went on across a sequence leaving or joining"
    assert steady == general


def test_preemption_and_a_full_cache_leave_the_steady_path_alike(tmp_path: Path) -> None:
    """Too few blocks for every row to grow: the steady step finds no block for a row whose
    token opens one and hands the step to the general path, which preempts."""
    general, _ = _run(tmp_path, 7, 1, steady=False, blocks=9)
    steady, (taken, _) = _run(tmp_path, 7, 1, steady=True, blocks=9)
    assert taken > 0
    assert general[-1] > 0, "no preemption: the case is not tested"
    assert steady == general


def _seqs(n: int, bs: int) -> list[Sequence]:
    out = []
    for i in range(n):
        s = seq_for(f"s{i}", [1] * (3 + i), SamplingParams(temperature=0.0))
        s.block_table = list(range(10 * i, 10 * i + 1 + (3 + i) // bs))
        out.append(s)
    return out


def test_extend_writes_the_grown_rows_and_falls_back_for_another_list() -> None:
    tables = DecodeTables()
    seqs = _seqs(5, 4)
    first = tables.of(seqs)
    assert tables.extend(seqs, []).tolist() == first.tolist()
    seqs[2].block_table.append(99)
    seqs[4].block_table += [98, 97, 96]  # wider than the array was: it widens
    got = tables.extend(seqs, [2, 4])
    assert got.tolist() == DecodeTables().of(seqs).tolist()
    again = list(seqs)  # the same rows as another list: of() checks them
    seqs[0].block_table.append(95)
    assert tables.extend(again, []).tolist() == DecodeTables().of(again).tolist()


def test_of_decodes_packs_what_build_packs() -> None:
    bs = 4
    seqs = _seqs(6, bs)
    for s in seqs:
        s.token_ids.append(-(int(s.request_id[1:]) + 1))  # each row's placeholder
        s.num_computed = len(s.token_ids) - 1
        s.settle()
    starts = [s.num_computed for s in seqs]
    rows = DecodeRows.of(seqs, starts)
    chunks = [ScheduledChunk(s, p, 1) for s, p in zip(seqs, starts, strict=True)]
    built = StepBatch.build(chunks, bs, DecodeTables())
    packed = StepBatch.of_decodes(rows, bs, DecodeTables())
    assert _batch(packed) == _batch(built)
    assert packed.placeholders and np.array_equal(packed.decode_ctx_lens, built.decode_ctx_lens)
