"""A pure decode step's decoder stack in one C++ call (engine/builtin/cpu_decode.py,
cpu_kernels/decode_stack.cpp): on the real default model it is the eager forward bit for bit,
the hidden states and the KV it writes, for each kernel build this CPU runs, and the engine takes
it for decode steps and only for them."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from tests.engine.conftest import EngineFactory, collect, greedy, loaded_model
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin import cpu_decode
from trtllm_gateway.engine.builtin.attention import (
    AttentionMetadata,
    decode_kernel,
    paged_attention,
)
from trtllm_gateway.engine.builtin.loader import ATTN_FMA_COST, LoadedModel, load
from trtllm_gateway.engine.builtin.model import MLP, Attention, RMSNorm
from trtllm_gateway.engine.builtin.packed_linear import PACKED_MAX_ROWS, PackedLinear
from trtllm_gateway.engine.protocol import GenerateRequest

BLOCKS = 128


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load(EngineConfig(device="cpu", dtype="float32", num_kv_blocks=BLOCKS))


def use_kernels(loaded: LoadedModel, kernels: Any) -> None:
    """Every CPU kernel of the model, the eager path's and the stack's, from `kernels`."""
    model = loaded.model
    for m in model.modules():
        if isinstance(m, PackedLinear):
            m._kernels = kernels
            m._mm = kernels.q4_1_mm if m.kind == "q4_1" else kernels.q8_0_mm
        elif isinstance(m, RMSNorm):
            m.kernel = kernels.rms_norm
        elif isinstance(m, Attention):
            m.rope_store = kernels.rope_store
        elif isinstance(m, MLP):
            m.silu_mul = kernels.silu_mul
    model.attn_fn = functools.partial(paged_attention, decode=decode_kernel(kernels))
    caches = loaded.backend.kv_caches
    bs = loaded.backend.block_size
    assert cpu_decode.attach_decode_stack(model, kernels, caches, bs, ATTN_FMA_COST)


def decode_step(lens: list[int], block_size: int, seed: int) -> tuple[Any, ...]:
    """ids, positions and metadata of one decode row per context length, each row on blocks of
    its own (as the block manager hands them out), scattered over the cache."""
    g = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in lens)
    blocks = torch.randperm(BLOCKS, generator=g)[: width * len(lens)].view(len(lens), width)
    pos = torch.tensor(lens) - 1
    slots = blocks[torch.arange(len(lens)), pos // block_size] * block_size + pos % block_size
    meta = AttentionMetadata(
        slot_mapping=slots,
        num_decodes=len(lens),
        decode_blocks=blocks.contiguous(),
        block_size=block_size,
        decode_len=max(lens),
        decode_ctx_lens=torch.tensor(lens, dtype=torch.int32),
    )
    ids = torch.randint(0, 49152, (len(lens),), generator=g)
    return ids, pos, meta


@pytest.mark.parametrize(
    "lens",
    [
        [1],
        [130],
        [5, 77, 16, 1],
        [3 + 7 * i for i in range(16)],
        [1 + 7 * i % 16 for i in range(64)],
    ],
)
@torch.inference_mode()
def test_decode_stack_is_the_eager_forward_bit_for_bit(
    loaded: LoadedModel, kernels: Any, lens: list[int]
) -> None:
    use_kernels(loaded, kernels)
    model, caches = loaded.model, loaded.backend.kv_caches
    whole = caches[0][0]._base  # one tensor holds every layer's K and V
    assert whole is not None and whole.shape[0] == len(caches)
    whole.copy_(torch.randn(whole.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    before = whole.clone()
    ids, pos, meta = decode_step(lens, loaded.backend.block_size, seed=len(lens))
    assert model.cpu_decode.applies(ids, caches, meta)
    fused = model(ids, pos, caches, meta)
    fused_kv = whole.clone()
    whole.copy_(before)
    stack, model.cpu_decode = model.cpu_decode, None
    try:
        eager = model(ids, pos, caches, meta)
    finally:
        model.cpu_decode = stack
    assert torch.equal(fused, eager)
    assert torch.equal(fused_kv, whole)  # the new tokens' K and V, written the same
    assert not torch.equal(fused_kv, before)


@torch.inference_mode()
def test_decode_stack_leaves_other_steps_to_the_eager_path(loaded: LoadedModel) -> None:
    model, caches = loaded.model, loaded.backend.kv_caches
    stack = model.cpu_decode
    assert stack is not None
    ids, _pos, meta = decode_step([3, 9], loaded.backend.block_size, seed=0)
    assert stack.applies(ids, caches, meta)
    assert not stack.applies(ids, list(caches), meta)  # another cache than the one bound
    meta.num_decodes = 1  # a mixed step: one decode row, one prefill row
    assert not stack.applies(ids, caches, meta)
    many = torch.zeros(PACKED_MAX_ROWS + 1, dtype=torch.long)
    meta.num_decodes = PACKED_MAX_ROWS + 1  # the dense matmuls' size
    assert not stack.applies(many, caches, meta)


async def test_engine_decodes_through_the_stack(
    make_engine: EngineFactory, chat_prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served greedy decoding runs its decode steps in the one call (and its prefill not);
    int8 activations and dense weights keep the eager forward."""
    calls: list[int] = []
    real = cpu_decode.CpuDecode.forward

    def spy(self: cpu_decode.CpuDecode, h: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(h.shape[0])
        return real(self, h, *args)

    monkeypatch.setattr(cpu_decode.CpuDecode, "forward", spy)
    engine = await make_engine()
    assert loaded_model(engine).cpu_decode is not None
    out = await collect(engine, GenerateRequest("d", tuple(chat_prompts[0]), greedy(8)))
    assert sum(len(e.token_ids) for e in out) == 8
    assert calls == [1] * 7  # the first token comes from the prefill step
    assert loaded_model(await make_engine(packed_weights="int8")).cpu_decode is None
    assert loaded_model(await make_engine(packed_weights="off")).cpu_decode is None
