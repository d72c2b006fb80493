"""The CUDA engine (Triton kernels, decode graphs, overlapped steps) against an fp32 reference.

Dummy weights of the shipped shapes (the 8B shape cut to 2 layers to fit beside its reference).
The reference is HF transformers' LlamaForCausalLM in float32 with the engine's own weights,
run greedily without a cache. The fp32 engine must match it token for token; the bf16 engine
must match it until the first divergence, and may diverge only where the reference's top two
logits are nearly tied.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.configs import builtin_config
from tests.in_thread import thread_core
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams
from trtllm_gateway.engine.transport.client import CoreClient

CUDA = torch.device("cuda")
NEW_TOKENS = 12
PROMPT_LENS = (5, 23, 70)


def shape_file(tmp_path: Path, name: str, layers: int | None) -> Path:
    cfg = json.loads(Path(f"trtllm_gateway/config/models/{name}.json").read_text())
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


def hf_reference(engine: CoreClient, shape: Path) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    lm = thread_core(engine).loaded
    assert lm is not None
    cfg = lm.cfg
    hf = LlamaForCausalLM(LlamaConfig(**json.loads(shape.read_text()), attn_implementation="eager"))
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    sd: dict[str, torch.Tensor] = {}
    for name, p in lm.model.named_parameters(remove_duplicate=False):
        p = p.detach().float().cpu()
        if "qkv_proj" in name:
            for part, t in zip("qkv", p.split([q, kv, kv]), strict=True):
                sd["model." + name.replace("qkv_proj", f"{part}_proj")] = t
        elif "gate_up_proj" in name:
            gate, up = p.chunk(2)
            sd["model." + name.replace("gate_up_proj", "gate_proj")] = gate
            sd["model." + name.replace("gate_up_proj", "up_proj")] = up
        elif name == "lm_head.weight":
            sd[name] = p
        else:
            sd["model." + name] = p
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return hf.to(CUDA).eval()


@torch.no_grad()
def reference_greedy(hf: Any, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    ids = list(prompt)
    out, logits = [], []
    for _ in range(NEW_TOKENS):
        row = hf(torch.tensor([ids], device=CUDA)).logits[0, -1].float()
        tok = int(row.argmax())
        out.append(tok)
        logits.append(row)
        ids.append(tok)
    return out, logits


async def engine_greedy(engine: CoreClient, prompts: list[list[int]]) -> list[list[int]]:
    async def one(i: int, p: list[int]) -> list[int]:
        sp = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        req = GenerateRequest(request_id=f"r{i}", prompt_token_ids=tuple(p), sampling=sp)
        return [t async for ev in engine.generate(req) for t in ev.token_ids]

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def check(got: list[int], want: list[int], logits: list[torch.Tensor], exact: bool) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g == w:
            continue
        assert not exact, f"token {i}: engine {g}, reference {w}"
        row = logits[i]
        margin = float(row[w] - row[g])
        assert margin < 0.02 * float(row.std()), f"token {i}: engine {g}, reference {w}, {margin}"
        return  # the continuations differ from here on


@pytest.mark.parametrize(("name", "layers"), [("smollm2-135m", None), ("llama-3.1-8b", 2)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("graphs", [True, False])
async def test_engine_matches_fp32_reference(
    tmp_path: Path, name: str, layers: int | None, dtype: str, graphs: bool
) -> None:
    shape = shape_file(tmp_path, name, layers)
    config = builtin_config(
        model=str(shape),
        load_format="dummy",
        device="cuda",
        dtype=dtype,  # type: ignore[arg-type]
        max_model_len=512,
        num_kv_blocks=256,
        max_batch_size=8,
        max_num_tokens=64,  # the 70-token prompt is prefilled in two chunks
        cuda_graphs=graphs,
    )
    engine = core_client(config, in_thread=True)
    await engine.start()
    try:
        rng = random.Random(0)
        prompts = [[rng.randrange(100, 30000) for _ in range(n)] for n in PROMPT_LENS]
        got = await engine_greedy(engine, prompts)
        again = await engine_greedy(engine, prompts[:1])  # prefix-cache hit, alone in the batch
        hf = hf_reference(engine, shape)
        for p, g in zip(prompts, got, strict=True):
            want, logits = reference_greedy(hf, p)
            check(g, want, logits, exact=dtype == "float32")
            if p is prompts[0]:
                check(again[0], want, logits, exact=dtype == "float32")
    finally:
        await engine.stop()
