"""Outcomes.accept_tokens: the per-token fast path gives the events accept() gives, row by row.

A plain row (no logprobs, constraint, processor, penalty or min_tokens: Sequence.settle) takes
the fast path once its first event is out: its stop rules folded into a set of ids and a length.
Each case drives two twin sequences through the same tokens, one by accept_tokens and one by
accept() a token at a time (the path every row took before), and wants the same events:
tokens, finish reason, stop token and usage (issue 39, item 2).
"""

from __future__ import annotations

import pytest
import torch

from trtllm_gateway.engine.builtin.block_manager import BlockManager
from trtllm_gateway.engine.builtin.outcomes import Emitted, Outcomes
from trtllm_gateway.engine.builtin.sampler import SampleResult
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence, Status
from trtllm_gateway.engine.protocol import SamplingParams, TokenEvent

EOS = 2
PROMPT = [11, 12, 13, 14]
MAX_MODEL_LEN = 12


def _running(outcomes: Outcomes, sp: SamplingParams) -> Sequence:
    seq = Sequence("r", list(PROMPT), len(PROMPT), sp, torch.Generator())
    seq.settle()
    seq.status = Status.RUNNING
    outcomes.scheduler.running.append(seq)
    return seq


def _outcomes() -> Outcomes:
    sched = Scheduler(BlockManager(16, 4, enable_prefix_caching=False), 8, 64)
    return Outcomes(sched, (EOS,), MAX_MODEL_LEN)


def _drive(
    tokens: list[int], sp: SamplingParams, fast: bool
) -> tuple[list[tuple[object, ...]], Sequence]:
    outcomes = _outcomes()
    seq = _running(outcomes, sp)
    events: Emitted = []
    for token in tokens:
        if seq.status is Status.FINISHED:
            break
        seq.token_ids.append(-1)  # the placeholder its step left
        if fast:
            outcomes.accept_tokens([seq], [token], 0.0, events)
        else:
            seq.token_ids[-1] = token
            outcomes.accept(seq, SampleResult(token, None), 0.0, events)
    out: list[tuple[object, ...]] = []
    for _, ev in events:
        assert isinstance(ev, TokenEvent)
        out.append((ev.token_ids, ev.logprobs, ev.finish_reason, ev.stop_token_id, ev.usage))
    return out, seq


CASES = {
    "eos stops": (SamplingParams(max_tokens=20), [5, 6, 7, EOS, 8], True),
    "eos ignored, a stop id stops": (
        SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=(9,)),
        [5, EOS, 6, 9, 8],
        True,
    ),
    "max_tokens": (SamplingParams(max_tokens=4, ignore_eos=True), [5, 6, 7, 8, 9], True),
    "max_model_len": (SamplingParams(max_tokens=50), [5, 6, 7, 8, 9, 10, 3, 4, 5], True),
    "min_tokens keeps every check": (
        SamplingParams(max_tokens=9, min_tokens=3),
        [EOS, 5, EOS],
        False,
    ),
    "a penalty keeps every check": (
        SamplingParams(max_tokens=3, repetition_penalty=1.2),
        [5, 6, 7],
        False,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fast_path_gives_the_events_accept_gives(case: str) -> None:
    sp, tokens, plain = CASES[case]
    fast, seq = _drive(tokens, sp, fast=True)
    slow, _ = _drive(tokens, sp, fast=False)
    assert fast == slow
    assert fast[-1][2] is not None  # every case ends
    assert seq.plain == plain
    assert seq.streaming == plain  # the fast path was taken after the first event


def test_a_row_finished_or_aborted_while_its_step_ran_is_skipped() -> None:
    outcomes = _outcomes()
    seqs = [_running(outcomes, SamplingParams(max_tokens=9)) for _ in range(3)]
    for s in seqs:
        s.token_ids.append(-1)
    seqs[0].status = Status.FINISHED  # aborted
    seqs[1].token_ids[-1] = 6  # already resolved
    events: Emitted = []
    outcomes.accept_tokens(seqs, [4, 5, 7], 0.0, events)
    assert [ev.token_ids for _, ev in events if isinstance(ev, TokenEvent)] == [(7,)]
    assert seqs[0].token_ids[-1] == -1 and seqs[1].token_ids[-1] == 6
