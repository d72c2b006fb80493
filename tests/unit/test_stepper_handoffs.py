"""Held KV hand-offs in the Stepper (issue 24): one per request id, a bound, and the stall flag the
step loops wait on instead of spinning (tiny random Llama on CPU, as tests/unit/test_stepper.py)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_stepper import (
    PROMPTS,
    overlapped_stepper,
    plain_stepper,
    seq_for,
    tiny_model,
)
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.stepper import Stepper
from trtllm_gateway.engine.protocol import (
    InvalidRequestError,
    OverloadedError,
    SamplingParams,
    TokenEvent,
)


def held(request_id: str, prompt: list[int]) -> Sequence:
    seq = seq_for(request_id, prompt, SamplingParams(max_tokens=1, temperature=0.0))
    seq.hold_kv = True
    return seq


def prefill(st: Stepper, seq: Sequence) -> None:
    """Run a context phase to its end: its blocks stay held for a sibling."""
    assert st.add(seq) == []
    for _ in range(20):
        if seq.request_id in st.handoffs:
            return
        st.step()
    raise AssertionError("the context phase never finished")


def test_a_second_hand_off_under_one_id_is_refused(tmp_path: Path) -> None:
    lm = tiny_model(tmp_path)
    st = plain_stepper(lm)
    total = lm.blocks.num_blocks
    prefill(st, held("dup", PROMPTS[3]))
    taken = total - lm.blocks.num_free
    assert taken > 0
    for again in (held("dup", PROMPTS[2]), seq_for("dup", PROMPTS[1], SamplingParams())):
        ((rid, err),) = st.add(again)
        assert rid == "dup" and isinstance(err, InvalidRequestError), err
        assert "holds KV" in str(err)
    assert not st.scheduler.has_work() and lm.blocks.num_free == total - taken
    st.release_kv("dup")
    assert lm.blocks.num_free == total


def test_context_phases_past_the_bound_are_overloaded(tmp_path: Path) -> None:
    lm = tiny_model(tmp_path)
    sched_stepper = plain_stepper(lm)
    st = Stepper(lm, sched_stepper.scheduler, sched_stepper.sampler, lm.max_model_len, 30.0, 3)
    long_prompt = [i % 90 for i in range(40)]  # 3 blocks of 16
    assert st.add(held("a", long_prompt)) == []  # in flight, not yet held: it still counts
    ((rid, err),) = st.add(held("b", PROMPTS[0]))
    assert rid == "b" and isinstance(err, OverloadedError), err
    plain = seq_for("c", PROMPTS[0], SamplingParams(max_tokens=2))
    assert st.add(plain) == []  # the bound is on held KV only
    st.abort("a")
    st.abort("c")
    assert lm.blocks.num_free == lm.blocks.num_blocks


def test_a_queue_waiting_for_held_blocks_is_stalled_until_they_go(tmp_path: Path) -> None:
    lm = tiny_model(tmp_path, num_kv_blocks=12)
    st = plain_stepper(lm, max_num_tokens=256)  # each prompt in one chunk
    prefill(st, held("h", [i % 90 for i in range(100)]))  # 7 of 12 blocks held
    big = seq_for("big", [i % 90 for i in range(95)], SamplingParams(max_tokens=2))
    assert st.add(big) == [] and not st.stalled
    assert st.step() == []
    assert st.stalled and st.scheduler.has_work()  # nothing will change without a message
    assert st.step() == [] and st.stalled
    st.expire_handoffs(float("inf"))  # the hand-off's expiry frees the blocks
    assert not st.stalled
    events = []
    for _ in range(20):
        events += st.step()
        if not st.scheduler.has_work():
            break
    assert isinstance(events[-1][1], TokenEvent) and events[-1][1].finish_reason == "length"
    assert lm.blocks.num_free == lm.blocks.num_blocks


def test_a_context_phase_at_depth_1_holds_its_prompt_blocks_only(tmp_path: Path) -> None:
    """At overlap depth 1 (a GPU's) the step after a context phase's prefill is scheduled
    before its one token is known: that token is its last (max_tokens 1), so the step computes
    no row for it (scheduler.drains) and no block is taken for the token after the prompt. A
    32-token prompt holds its 2 blocks of 16, and the backend sees its 32 rows once."""
    lm = tiny_model(tmp_path)
    st, runner = overlapped_stepper(lm)
    other = seq_for("other", PROMPTS[1], SamplingParams(max_tokens=12, temperature=0.0))
    assert st.add(other) == []
    st.step()  # "other" decodes beside the context phase from here on
    prefill(st, held("ctx", [i % 90 for i in range(32)]))
    assert len(st.handoffs["ctx"][0].block_table) == 2
    rows = sum(c.length for b in runner.batches for c in b.chunks if c.seq.request_id == "ctx")
    assert rows == 32
    while st.scheduler.has_work():
        st.step()
    st.release_kv("ctx")
    assert lm.blocks.num_free == lm.blocks.num_blocks
