"""--quantization int8: int8 weight copies for small CPU batches, dense matmul otherwise."""

from __future__ import annotations

import torch
from torch import nn

from tests.engine.conftest import EngineFactory, collect, greedy
from trtllm_gateway.engine.builtin.quant import INT8_MAX_ROWS, Int8Linear
from trtllm_gateway.engine.protocol import GenerateRequest


def test_int8_linear_close_to_dense_and_dense_for_big_batches() -> None:
    torch.manual_seed(0)
    dense = nn.Linear(576, 1536, bias=False).to(torch.bfloat16)
    q = Int8Linear(dense)
    small = torch.randn(2, 576, dtype=torch.bfloat16)
    ref = dense(small).float()
    err = (q(small).float() - ref).norm() / ref.norm()
    assert 0 < err < 0.02  # really the int8 path, and close
    big = torch.randn(INT8_MAX_ROWS + 1, 576, dtype=torch.bfloat16)
    assert torch.equal(q(big), dense(big))
    fp32 = nn.Linear(64, 32, bias=False)
    x = torch.randn(1, 64)
    assert torch.equal(Int8Linear(fp32)(x), fp32(x))  # fp32 activations stay dense


async def test_int8_engine_answers_like_bf16(
    make_engine: EngineFactory, chat_prompts: list[list[int]], tokenizer: object
) -> None:
    engine = await make_engine(dtype="bfloat16", quantization="int8")
    events = await collect(engine, GenerateRequest("q", tuple(chat_prompts[0]), greedy(12)))
    text = tokenizer.decode([t for ev in events for t in ev.token_ids])  # type: ignore[attr-defined]
    assert "Paris" in text
