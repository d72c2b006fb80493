"""Constrained decoding on CUDA: dummy SmolLM2-shaped weights, the real tokenizer.

Random weights give near-random logits, so every output that conforms does so because of the
mask (and the bounded schema makes every output finish). Runs the CUDA sampler, the batched
mask op and the overlap scheduler. Needs the tokenizer files in GUIDED_TOKENIZER_DIR.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from tests.configs import builtin_config
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.guided.matcher import RowMatcher, apply_bitmask
from trtllm_gateway.engine.protocol import (
    GenerateRequest,
    GuidedDecoding,
    InvalidRequestError,
    SamplingParams,
)
from trtllm_gateway.engine.transport.client import CoreClient

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "role": {"type": "string", "enum": ["admin", "user"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "role", "n", "tags"],
    "additionalProperties": False,
}
COLOR_RE = r"(red|green|blue) [0-9]{1,3}"


def _tokenizer_dir() -> Path:
    env = os.environ.get("GUIDED_TOKENIZER_DIR")
    if not env:
        pytest.skip("set GUIDED_TOKENIZER_DIR to SmolLM2's tokenizer files")
    return Path(env)


@pytest.fixture
async def engine() -> Any:
    tok = _tokenizer_dir()
    e = core_client(
        builtin_config(
            model="trtllm_gateway/config/models/smollm2-135m.json",
            load_format="dummy",
            tokenizer=str(tok),
            device="cuda",
            # float32: bf16 GEMMs vary with the batch's shape, which can flip a near-tied greedy
            # pick of a free row (seen on an H100), and this test compares free rows to alone.
            dtype="float32",
            max_model_len=512,
            num_kv_blocks=256,
            max_batch_size=16,
        ),
        in_thread=True,
    )
    await e.start()
    yield e
    await e.stop()


async def _run(e: CoreClient, req: GenerateRequest) -> tuple[list[int], str | None]:
    toks: list[int] = []
    reason = None
    async for ev in e.generate(req):
        toks += ev.token_ids
        reason = ev.finish_reason
    return toks, reason


def _decode(e: CoreClient, toks: list[int]) -> str:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(_tokenizer_dir()))
    return str(hf.decode([t for t in toks if t not in e.info.eos_token_ids]))


async def test_constrained_rows_conform_beside_free_rows(engine: CoreClient) -> None:
    prompt = tuple(range(100, 130))
    free = [
        GenerateRequest(f"f{i}", prompt[i:], SamplingParams(max_tokens=12, temperature=0.0))
        for i in range(3)
    ]
    alone = [await _run(engine, r) for r in free]
    guided = []
    for seed in range(6):
        g = (
            GuidedDecoding("json", json.dumps(SCHEMA))
            if seed % 2
            else GuidedDecoding("regex", COLOR_RE)
        )
        sp = SamplingParams(max_tokens=200, temperature=0.8, seed=seed, guided=g)
        guided.append(GenerateRequest(f"g{seed}", prompt, sp))
    results = await asyncio.gather(*(_run(engine, r) for r in [*free, *guided]))
    assert results[:3] == alone  # the masks of other rows change nothing for free rows
    for req, (toks, reason) in zip(guided, results[3:], strict=True):
        assert reason == "stop"
        text = _decode(engine, toks)
        assert req.sampling.guided is not None
        if req.sampling.guided.kind == "json":
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert re.fullmatch(COLOR_RE, text), text


async def test_bias_allowed_ids_and_isolation_on_cuda(
    engine: CoreClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = tuple(range(200, 220))
    sp = SamplingParams(max_tokens=4, temperature=0.0, logit_bias=((777, 100.0),))
    assert (await _run(engine, GenerateRequest("bias", prompt, sp)))[0] == [777] * 4
    sp = SamplingParams(max_tokens=6, temperature=1.0, seed=1, allowed_token_ids=(5, 6))
    assert set((await _run(engine, GenerateRequest("allow", prompt, sp)))[0]) <= {5, 6}
    victims = [
        GenerateRequest(f"v{i}", prompt[i:], SamplingParams(max_tokens=8, temperature=0.0))
        for i in range(3)
    ]
    alone = [await _run(engine, v) for v in victims]

    # The attack's row raises in the sampler (its matcher, made to fail): out-of-range ids, which
    # used to stand in for it, never pass the engine's door (engine/builtin/sequence_builder.py).
    def sync(self: RowMatcher, token_ids: list[int], prompt_len: int) -> None:
        raise ValueError("injected matcher failure")

    monkeypatch.setattr(RowMatcher, "sync", sync)
    guided = GuidedDecoding("regex", "[a-z ]+")
    attack = GenerateRequest("attack", prompt, SamplingParams(max_tokens=8, guided=guided))
    got = await asyncio.gather(
        _run(engine, attack), *(_run(engine, v) for v in victims), return_exceptions=True
    )
    assert isinstance(got[0], InvalidRequestError)
    assert got[1:] == alone
    assert engine.health().state == "ready"


def test_bitmask_on_cuda_matches_cpu() -> None:
    vocab = 49152
    gen = torch.Generator().manual_seed(0)
    mask = torch.randint(
        -(2**31), 2**31 - 1, (4, (vocab + 31) // 32), generator=gen, dtype=torch.int64
    ).to(torch.int32)
    logits = torch.randn(4, vocab, generator=gen)
    cpu = logits.clone()
    apply_bitmask(cpu, mask)
    gpu = logits.cuda()
    apply_bitmask(gpu, mask.pin_memory())
    assert torch.equal(gpu.cpu(), cpu)
    assert 0.3 < float(torch.isfinite(cpu).float().mean()) < 0.7
