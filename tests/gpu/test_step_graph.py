"""Whole mixed-step graphs (engine/builtin/step_graph.py): every step that replays one graph,
attentions included, gives the hidden states the pieces give on the same inputs, bit for bit,
while a real engine serves prompts whose prefills ride along other requests' decodes (float32,
bfloat16, and an e4m3 KV cache); and a burst of more prompt chunks than a whole graph takes
runs the pieces. Dummy weights of the SmolLM2-135M shape."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.configs import builtin_config
from tests.gpu.test_greedy_equivalence import shape_file
from tests.in_thread import thread_core
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.builtin.sampler import Draws
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.step_graph import PREFILLS, StepGraphs
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams
from trtllm_gateway.engine.transport.client import CoreClient

NEW_TOKENS = 12


def _check_against_pieces(backend: Any, steps: list[tuple[int, str]], wrong: list[object]) -> None:
    """After each whole-graph step, run the same step's pieces on the inputs still loaded (the
    K/V they store are the same values at the same slots) and compare the hidden states. Records
    (prompt chunks, "whole" or "pieces") for every step that runs either, and in `wrong` what
    differed (the test asserts on it: an exception here would stop the engine's core)."""
    forward, whole, pw = backend.forward, backend.whole, backend.pieces

    def checked(
        batch: StepBatch, prev: torch.Tensor | None, draws: Draws | None = None
    ) -> torch.Tensor:
        before, pieces_before = whole.replays, pw.replays
        out = forward(batch, prev, draws)
        chunks = len(batch.prefill_q_lens)
        if whole.replays > before:
            try:
                tokens = len(batch.token_ids)
                b = pw.bucket(tokens)
                got = pw.hidden[:tokens].clone()
                meta = backend._meta(batch, pw.slots[:tokens])
                meta.decode_splits = whole.splits[b]  # the bucket's split count, as captured
                want = pw.run(b, tokens, meta)
                if not torch.equal(got, want):
                    diff = (got.float() - want.float()).abs()
                    rows = diff.amax(1).nonzero().flatten().tolist()
                    wrong.append((tokens, batch.num_decodes, diff.max().item(), rows[:8]))
            except Exception as e:
                wrong.append(repr(e))
            steps.append((chunks, "whole"))
        elif pw.replays > pieces_before:
            steps.append((chunks, "pieces"))
        return out

    backend.forward = checked


async def _serve(engine: CoreClient, prompts: list[list[int]], stagger: int) -> None:
    """The first `stagger` prompts start first; the rest join once they decode."""
    sp = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    started = asyncio.Event()

    async def one(i: int, p: list[int]) -> None:
        if 0 < stagger <= i:
            await started.wait()
        n = 0
        req = GenerateRequest(request_id=f"r{i}", prompt_token_ids=tuple(p), sampling=sp)
        async for ev in engine.generate(req):
            n += len(ev.token_ids)
            if n >= 3:
                started.set()
        assert n == NEW_TOKENS

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


@pytest.mark.parametrize(
    ("dtype", "kv"), [("float32", "auto"), ("bfloat16", "auto"), ("bfloat16", "fp8")]
)
async def test_whole_step_graphs_equal_the_pieces(tmp_path: Path, dtype: str, kv: str) -> None:
    shape = shape_file(tmp_path, "smollm2-135m", None)
    rng = random.Random(2)
    lens = (5, 40, 90, 300, 130, 17, 200, 64, 1000, 33)
    prompts = [[rng.randrange(100, 30000) for _ in range(n)] for n in lens]
    config = builtin_config(
        model=str(shape),
        load_format="dummy",
        device="cuda",
        dtype=dtype,  # type: ignore[arg-type]
        kv_cache_dtype=kv,  # type: ignore[arg-type]
        seed=0,
        max_model_len=2048,
        num_kv_blocks=1024,
        max_batch_size=64,
        max_num_tokens=512,
        cuda_graphs=True,
    )
    engine = core_client(config, in_thread=True)
    await engine.start()
    try:
        lm = thread_core(engine).loaded
        assert lm is not None
        backend = lm.backend
        assert isinstance(backend.whole, StepGraphs)
        steps: list[tuple[int, str]] = []
        wrong: list[object] = []
        _check_against_pieces(backend, steps, wrong)
        await asyncio.wait_for(_serve(engine, prompts, stagger=3), 120)
        assert not wrong, wrong
        # Decodes beside prompt chunks, and steps of prompt chunks alone.
        assert len(steps) >= 3 and all(path == "whole" for _, path in steps), steps
        # Bursts of short prompts: a step of more chunks than a whole graph takes runs the
        # pieces, every other step the whole graph.
        burst = [[rng.randrange(100, 30000) for _ in range(9)] for _ in range(200)]
        await asyncio.wait_for(_serve(engine, burst, stagger=0), 120)
        assert not wrong, wrong
        assert all((path == "whole") == (n <= PREFILLS) for n, path in steps), steps
        assert any(n > PREFILLS for n, _ in steps), steps
    finally:
        await engine.stop()
