"""The Stepper's StepPipeline at depth 0 and 1 on a tiny random Llama (CPU), and the step
modules' import graph.

Depth 1 is CUDA's default (placeholder ids, resolved one step late); here it runs on the CPU
backend and sampler, the code the GPU runs above the backend: one step late, the placeholders,
the commits, the stop checks, the blocks it frees. With CUDA, the Triton backend runs too.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import pytest
import torch

from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin.backend import Backend
from trtllm_gateway.engine.builtin.loader import LoadedModel, load
from trtllm_gateway.engine.builtin.outcomes import Emitted
from trtllm_gateway.engine.builtin.sampler import Draws, Sampler
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.stepper import Stepper
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams, TokenEvent

VOCAB = 96
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "eos_token_id": VOCAB - 1,
    "tie_word_embeddings": True,
}
PROMPTS = [[(7 * i + 3 * j) % (VOCAB - 1) for j in range(5 + 3 * i)] for i in range(4)]


def tiny_model(tmp_path: Path, device: str = "cpu", **overrides: object) -> LoadedModel:
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    base: dict[str, object] = {
        "model": str(cfg),
        "load_format": "dummy",
        "device": device,
        "dtype": "float32",
        "block_size": 16,
        "num_kv_blocks": 32,
        "cuda_graphs": False,
        "enable_prefix_caching": False,
    }
    return load(EngineConfig(**(base | overrides)))  # type: ignore[arg-type]


class Recording:
    """The model's own backend, keeping every StepBatch it was given."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.depth = inner.depth
        self.takes_draws = inner.takes_draws
        self.kv_caches = inner.kv_caches
        self.batches: list[StepBatch] = []

    def forward(
        self, batch: StepBatch, prev: torch.Tensor | None, draws: Draws | None = None
    ) -> torch.Tensor:
        self.batches.append(batch)
        return self.inner.forward(batch, prev, draws)

    @property
    def placeholders_seen(self) -> int:
        return sum(int((b.token_ids < 0).sum()) for b in self.batches)


def plain_stepper(
    lm: LoadedModel, max_batch_size: int = 8, max_num_tokens: int = 64, depth: int = 0
) -> Stepper:
    sched = Scheduler(lm.blocks, max_batch_size, max_num_tokens)
    st = Stepper(lm, sched, Sampler(lm.cfg.eos_token_ids), lm.max_model_len, depth=depth)
    assert st.pipeline.depth == depth
    return st


def overlapped_stepper(lm: LoadedModel, **kw: int) -> tuple[Stepper, Recording]:
    """Depth 1, CUDA's default, on the CPU backend: the placeholders swapped by the backend."""
    st = plain_stepper(lm, depth=1, **kw)
    runner = Recording(st.pipeline.backend)
    st.pipeline.backend = runner
    return st, runner


def seq_for(request_id: str, prompt: list[int], sp: SamplingParams) -> Sequence:
    req = GenerateRequest(request_id, tuple(prompt), sp)
    return Sequence.from_request(req, torch.Generator().manual_seed(0))


def run_all(
    st: Stepper,
    seqs: list[Sequence],
    max_steps: int = 400,
    late: dict[int, list[Sequence]] | None = None,
) -> dict[str, list[TokenEvent]]:
    """Every sequence to its end; late: more added before the step of that index."""
    late = late or {}
    out: dict[str, list[TokenEvent]] = {s.request_id: [] for s in seqs}
    out.update({s.request_id: [] for more in late.values() for s in more})
    for s in seqs:
        st.add(s)
    for step in range(max_steps):
        for s in late.pop(step, []):
            st.add(s)
        if not st.scheduler.has_work() and not late:
            break
        for request_id, ev in st.step():
            assert isinstance(ev, TokenEvent), ev
            out[request_id].append(ev)
    assert not st.scheduler.has_work(), "the requests did not finish"
    return out


def tokens(events: list[TokenEvent]) -> list[int]:
    return [t for ev in events for t in ev.token_ids]


def greedy(max_tokens: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)  # type: ignore[arg-type]


def workload() -> list[Sequence]:
    """Prompts of 5 to 14 tokens with budgets of 6 to 21: they finish at different steps."""
    return [seq_for(f"r{i}", p, greedy(6 + 5 * i)) for i, p in enumerate(PROMPTS)]


def outcome(events: dict[str, list[TokenEvent]]) -> dict[str, tuple[list[int], str | None]]:
    return {rid: (tokens(evs), evs[-1].finish_reason) for rid, evs in events.items()}


def test_overlap_gives_the_plain_steps_greedy_tokens(tmp_path: Path) -> None:
    plain = outcome(run_all(plain_stepper(tiny_model(tmp_path)), workload()))
    st, runner = overlapped_stepper(tiny_model(tmp_path))
    overlapped = outcome(run_all(st, workload()))
    assert runner.placeholders_seen > 0, "the pipeline never scheduled ahead"
    assert overlapped == plain
    assert [len(t) for t, _ in plain.values()] == [6, 11, 16, 21]
    assert {reason for _, reason in plain.values()} == {"length"}


def test_a_prompt_arriving_mid_run_gets_the_same_tokens_at_both_depths(tmp_path: Path) -> None:
    """run_all's `late`: a prompt added at step 5, while the others decode. At depth 1 its step
    is a mixed one whose decode rows are placeholders for the step before's ids."""

    def late() -> dict[int, list[Sequence]]:
        return {5: [seq_for("late", PROMPTS[1][::-1], greedy(9))]}

    plain = outcome(run_all(plain_stepper(tiny_model(tmp_path)), workload(), late=late()))
    st, runner = overlapped_stepper(tiny_model(tmp_path))
    overlapped = outcome(run_all(st, workload(), late=late()))
    assert overlapped == plain
    assert len(plain["late"][0]) == 9
    mixed = [b for b in runner.batches if b.num_decodes and b.num_decodes < len(b.chunks)]
    assert any((b.token_ids[: b.num_decodes] < 0).all() for b in mixed)


def test_a_stop_token_ends_the_sequence_one_step_late_without_a_wasted_token(
    tmp_path: Path,
) -> None:
    """The pipeline computes one token past a stop; it must not reach the request."""
    free = outcome(
        run_all(plain_stepper(tiny_model(tmp_path)), [seq_for("a", PROMPTS[1], greedy(12))])
    )
    toks = free["a"][0]
    stop_at = toks[4]
    cut = toks.index(stop_at) + 1
    for st in (plain_stepper(tiny_model(tmp_path)), overlapped_stepper(tiny_model(tmp_path))[0]):
        seq = seq_for("a", PROMPTS[1], greedy(12, stop_token_ids=(stop_at,)))
        events = run_all(st, [seq])["a"]
        assert tokens(events) == toks[:cut]
        assert events[-1].finish_reason == "stop" and events[-1].stop_token_id == stop_at
        assert events[-1].usage is not None and events[-1].usage.completion_tokens == cut


@pytest.mark.parametrize("steady", [True, False])
def test_no_step_computes_a_token_after_the_last_one_by_max_tokens(
    tmp_path: Path, steady: bool
) -> None:
    """At depth 1 a step is scheduled before the step before's ids are known: a row whose
    pending token is its max_tokens-th is not scheduled again (scheduler.drains; vLLM skips
    the same rows under async scheduling). Each sequence computes its prompt once and
    max_tokens - 1 decode rows, one-token requests (a disaggregated prefill's context phase) no
    decode row at all, and every token is the depth-0 engine's. steady=False: every step takes
    the general path (Scheduler.steady_steps off)."""
    budgets = {"one": 1, "two": 2, "r0": 6, "r1": 11, "r2": 16, "r3": 21}

    def seqs() -> list[Sequence]:
        out = [seq_for(f"r{i}", p, greedy(budgets[f"r{i}"])) for i, p in enumerate(PROMPTS)]
        one = seq_for("one", PROMPTS[2][::-1], greedy(1))
        return [*out, one, seq_for("two", PROMPTS[0][::-1], greedy(2))]

    plain = outcome(run_all(plain_stepper(tiny_model(tmp_path)), seqs()))
    st, runner = overlapped_stepper(tiny_model(tmp_path))
    st.scheduler.steady_steps = steady
    overlapped = outcome(run_all(st, seqs()))
    assert overlapped == plain
    assert {rid: len(t) for rid, (t, _) in plain.items()} == budgets
    rows: dict[str, int] = {}  # rows computed per request, a prompt chunk counting its tokens
    for batch in runner.batches:
        for chunk in batch.chunks:
            rows[chunk.seq.request_id] = rows.get(chunk.seq.request_id, 0) + chunk.length
    prompts = {s.request_id: s.prompt_len for s in seqs()}
    assert rows == {rid: prompts[rid] + budgets[rid] - 1 for rid in budgets}
    assert runner.placeholders_seen > 0  # the steps did run ahead
    assert st.scheduler.blocks.num_free == st.scheduler.blocks.num_blocks


@pytest.mark.parametrize("overlap", [False, True])
def test_a_finished_sequence_frees_its_blocks_while_others_run(
    tmp_path: Path, overlap: bool
) -> None:
    lm = tiny_model(tmp_path)
    st = overlapped_stepper(lm)[0] if overlap else plain_stepper(lm)
    short, long = seq_for("short", PROMPTS[0], greedy(3)), seq_for("long", PROMPTS[3], greedy(40))
    st.add(short)
    st.add(long)
    total = lm.blocks.num_blocks
    freed_early = False
    for _ in range(100):
        if not st.scheduler.has_work():
            break
        for request_id, ev in st.step():
            assert isinstance(ev, TokenEvent)
            if request_id == "short" and ev.finish_reason is not None:
                assert short.block_table == [] and "short" not in st.seqs
                assert long.block_table, "the long one still runs"
                assert lm.blocks.num_free == total - len(long.block_table)
                freed_early = True
    assert freed_early
    assert lm.blocks.num_free == total and not st.seqs and not st.scheduler.running


@pytest.mark.parametrize("overlap", [False, True])
def test_preempted_sequences_recompute_to_the_same_tokens(tmp_path: Path, overlap: bool) -> None:
    """Four sequences that cannot all grow in 4 blocks: the newest is preempted and recomputed."""
    ample = outcome(run_all(plain_stepper(tiny_model(tmp_path)), workload()))
    lm = tiny_model(tmp_path, num_kv_blocks=4)
    st = overlapped_stepper(lm)[0] if overlap else plain_stepper(lm)
    tight = outcome(run_all(st, workload()))
    assert st.scheduler.preemptions > 0
    assert tight == ample
    assert lm.blocks.num_free == lm.blocks.num_blocks


def test_an_abort_in_flight_counts_only_the_tokens_sent(tmp_path: Path) -> None:
    """Overlap: an aborted sequence holds an unresolved placeholder; usage must not count it."""
    lm = tiny_model(tmp_path)
    st, _ = overlapped_stepper(lm)
    seq = seq_for("a", PROMPTS[2], greedy(50))
    st.add(seq)
    sent: list[int] = []
    for _ in range(5):
        for _, ev in st.step():
            assert isinstance(ev, TokenEvent)
            sent += ev.token_ids
    assert seq.token_ids[-1] < 0, "a step is in flight"
    (request_id, final), *rest = st.abort("a")
    assert request_id == "a" and not rest and isinstance(final, TokenEvent)
    assert final.finish_reason == "abort"
    assert final.usage is not None and final.usage.completion_tokens == len(sent)
    assert all(ev == [] for ev in [st.step(), st.step()]), "nothing more for an aborted request"
    assert lm.blocks.num_free == lm.blocks.num_blocks


def test_a_sampling_failure_fails_its_row_only(tmp_path: Path) -> None:
    """A row whose logit_bias names a token past the vocabulary fails; its batch-mate goes on."""
    for st in (plain_stepper(tiny_model(tmp_path)), overlapped_stepper(tiny_model(tmp_path))[0]):
        good = seq_for("good", PROMPTS[0], greedy(4))
        bad = seq_for("bad", PROMPTS[1], greedy(4, logit_bias={VOCAB + 5: 1.0}))
        st.add(good)
        st.add(bad)
        events: Emitted = []
        while st.scheduler.has_work():
            events += st.step()
        failures = [(rid, ev) for rid, ev in events if not isinstance(ev, TokenEvent)]
        assert [rid for rid, _ in failures] == ["bad"]
        finals = [ev for rid, ev in events if rid == "good" and isinstance(ev, TokenEvent)]
        assert finals[-1].finish_reason == "length" and len(tokens(finals)) == 4
        assert not st.seqs and st.scheduler.blocks.num_free == st.scheduler.blocks.num_blocks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel path needs CUDA")
def test_cuda_overlap_on_and_off_give_the_same_greedy_tokens(tmp_path: Path) -> None:
    runs = []
    for depth in (1, 0):
        lm = tiny_model(tmp_path, device="cuda")
        sched = Scheduler(lm.blocks, 8, 64)
        st = Stepper(lm, sched, Sampler(lm.cfg.eos_token_ids), lm.max_model_len)
        assert st.pipeline.depth == 1, "CUDA steps overlap by default"
        st.pipeline.depth = depth
        runs.append(outcome(run_all(st, workload())))
        assert lm.blocks.num_free == lm.blocks.num_blocks
    assert runs[0] == runs[1]


STEP_MODULES = [
    f"trtllm_gateway.engine.builtin.{name}"
    for name in (
        "stepper",
        "pipeline",
        "outcomes",
        "backend",
        "cpu_backend",
        "triton_backend",
        "step_batch",
        "scheduler",
        "sampler",
        "core",
        "parts",
        "sequence_builder",
        "config",
    )
]


def test_the_step_modules_import_each_other_one_way_only() -> None:
    """No two step modules reach each other, directly or through others (lazy imports count)."""
    import grimp

    graph = grimp.build_graph("trtllm_gateway")
    cycles = [
        (a, b)
        for a, b in combinations(STEP_MODULES, 2)
        if graph.find_shortest_chain(a, b) and graph.find_shortest_chain(b, a)
    ]
    assert cycles == []


def test_the_step_pipeline_does_not_know_the_stepper() -> None:
    import grimp

    graph = grimp.build_graph("trtllm_gateway")
    pipeline = "trtllm_gateway.engine.builtin.pipeline"
    assert graph.find_shortest_chain(pipeline, "trtllm_gateway.engine.builtin.stepper") is None
