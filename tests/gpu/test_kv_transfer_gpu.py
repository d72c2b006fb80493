"""KV transfer v2 between two engine core processes on GPUs: cuda_ipc (paged: the decode GPU reads
the prompt's blocks across from the prefill GPU's pool into its reserved blocks, the prefill
side holding them until released) and shm (through the pinned host arena), each against the
decode engine's own aggregated greedy tokens.

Prefill on cuda:0 and decode on cuda:1 where there are two GPUs, else both on cuda:0 (CUDA IPC
between processes of one GPU). Both processes see every GPU (no CUDA_VISIBLE_DEVICES isolation):
an IPC handle names its GPU by index. Dummy weights of the 135M shape, drawn on each GPU by a
generator of one seed: the two engines' own greedy tokens are compared first, so a weight
mismatch fails as such, not as a transfer fault.

    python -m pytest tests/gpu/test_kv_transfer_gpu.py -m gpu -q
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.configs import builtin_config
from tests.gpu.test_greedy_equivalence import shape_file
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.kv_region import KvPayload
from trtllm_gateway.engine.protocol import DisaggParams, GenerateRequest, SamplingParams
from trtllm_gateway.engine.transport.client import CoreClient

DEVICES = ("cuda:0", "cuda:1") if torch.cuda.device_count() > 1 else ("cuda:0", "cuda:0")
PROMPT_LENS = (23, 70, 200)  # a partial last block, and several blocks


def engine(tmp_path: Path, device: str) -> CoreClient:
    config = builtin_config(
        model=str(shape_file(tmp_path, "smollm2-135m", None)),
        load_format="dummy",
        device=device,
        dtype="bfloat16",
        max_model_len=512,
        num_kv_blocks=256,
        max_batch_size=8,
    )
    return core_client(config)  # a process of its own: CUDA IPC opens no handle of its own


async def tokens(e: CoreClient, req: GenerateRequest) -> list[int]:
    return [t async for ev in e.generate(req) for t in ev.token_ids]


@pytest.mark.parametrize("transport", ["cuda_ipc", "shm"])
async def test_gpu_kv_transfer_equals_aggregated(tmp_path: Path, transport: str) -> None:
    prefill, decode = engine(tmp_path, DEVICES[0]), engine(tmp_path, DEVICES[1])
    await prefill.start()
    await decode.start()
    try:
        rng = random.Random(0)
        for i, n in enumerate(PROMPT_LENS):
            ids = tuple(rng.randrange(100, 30000) for _ in range(n))
            req = GenerateRequest(f"g{i}", ids, SamplingParams(max_tokens=16, temperature=0.0))
            aggregated = await tokens(decode, replace(req, request_id=f"agg{i}"))
            assert await tokens(prefill, replace(req, request_id=f"own{i}")) == aggregated
            context = DisaggParams("context_only", kv_device=transport == "cuda_ipc")
            res = await prefill.prefill(replace(req, disagg=context))
            region = await prefill.stage_kv(req.request_id)
            assert region.transport == transport
            assert (region.ipc is not None) == (transport == "cuda_ipc")
            # cuda_ipc is paged (kv_across.py): the prompt's blocks in the prefill pool
            assert bool(region.blocks) == (transport == "cuda_ipc")
            kv = KvPayload(region)
            disagg = DisaggParams("generation_only", res.first_token_ids, None, f"g{i}", None, kv)
            got = await tokens(decode, replace(req, disagg=disagg))
            prefill.release_kv(req.request_id)
            assert got == aggregated
        assert decode.health().kv_usage == 0.0  # every reserved block went back
        # The prefill side's held blocks went back at the releases (a request after them
        # brings a fresh health).
        tail = GenerateRequest("tail", (5, 6, 7), SamplingParams(max_tokens=2, temperature=0.0))
        await tokens(prefill, tail)
        assert prefill.health().kv_usage == 0.0
    finally:
        await decode.stop()
        await prefill.stop()
