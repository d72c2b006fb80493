"""Graphs of mixed steps (engine/builtin/step_graph.py, built on piecewise_graph.py's pieces):
steps that carry a prefill chunk beside decodes replay a graph, and give the tokens the eager path
gives (float32: every token; bfloat16: the same first token, and the same logprobs within
rounding). Dummy weights of the SmolLM2-135M shape, one seed, so both engines hold one model."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.configs import builtin_config
from tests.gpu.test_greedy_equivalence import shape_file
from tests.in_thread import thread_core
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.builtin.piecewise_graph import MIN_TOKENS, PiecewiseGraphs
from trtllm_gateway.engine.builtin.step_graph import StepGraphs
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams
from trtllm_gateway.engine.transport.client import CoreClient

NEW_TOKENS = 16
FIRST = (5, 40, 90)  # started first, so the later prompts' prefills ride along their decodes
LATER = (130, 17, 200, 64)


def test_the_smallest_bucket_is_past_the_skinny_steps() -> None:
    from trtllm_gateway.engine.builtin.kernels.skinny_gemm import MAX_ROWS

    assert MIN_TOKENS == MAX_ROWS + 1  # below it the fused path's skinny GEMMs run, eagerly


async def _run(engine: CoreClient, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    sp = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
    started = asyncio.Event()

    async def one(i: int, p: list[int]) -> tuple[list[int], list[float]]:
        if i >= len(FIRST):
            await started.wait()
        ids: list[int] = []
        lps: list[float] = []
        req = GenerateRequest(request_id=f"r{i}", prompt_token_ids=tuple(p), sampling=sp)
        async for ev in engine.generate(req):
            ids += ev.token_ids
            lps += [lp.logprob for lp in ev.logprobs or ()]
            if i == 0 and len(ids) >= 3:
                started.set()
        return ids, lps

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_mixed_steps_replay_the_pieces_and_match_eager(tmp_path: Path, dtype: str) -> None:
    shape = shape_file(tmp_path, "smollm2-135m", None)
    rng = random.Random(1)
    prompts = [[rng.randrange(100, 30000) for _ in range(n)] for n in (*FIRST, *LATER)]
    results = {}
    for graphs in (True, False):
        config = builtin_config(
            model=str(shape),
            load_format="dummy",
            device="cuda",
            dtype=dtype,  # type: ignore[arg-type]
            seed=0,
            max_model_len=512,
            num_kv_blocks=512,
            max_batch_size=8,
            max_num_tokens=256,
            cuda_graphs=graphs,
        )
        engine = core_client(config, in_thread=True)
        await engine.start()
        try:
            results[graphs] = await _run(engine, prompts)
            lm = thread_core(engine).loaded
            assert lm is not None
            pieces = getattr(lm.backend, "pieces", None)
            whole = getattr(lm.backend, "whole", None)
            if graphs:
                # Each mixed step replays its whole-step graph (step_graph.py), which runs the
                # pieces' captures with the attentions between; test_step_graph.py holds the two
                # to the same bits, and more chunks than a whole graph takes to the pieces.
                assert isinstance(pieces, PiecewiseGraphs) and isinstance(whole, StepGraphs)
                assert whole.replays > 0
            else:
                assert pieces is None and whole is None
        finally:
            await engine.stop()
    for (got, got_lp), (want, want_lp) in zip(results[True], results[False], strict=True):
        assert len(got) == len(want) == NEW_TOKENS
        if dtype == "float32":
            assert got == want
            assert got_lp == pytest.approx(want_lp, abs=1e-3)
        else:
            assert got[0] == want[0]
            assert got_lp[0] == pytest.approx(want_lp[0], abs=0.05)
