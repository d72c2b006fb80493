"""--dtype auto: bf16 on CUDA, float32 on CPU (bf16 there only with --quantization int8).

On a CPU with native bf16 dot products the old auto picked bf16, and SmolLM2-135M's greedy answer
to "What is the capital of France?" became "L'Etoile, la Marseillaise, ..." (float32 and HF
transformers say "The capital of France is Paris."); tests/e2e/test_openai_sdk.py checks that
answer end to end with the default dtype.
"""

from __future__ import annotations

import pytest
import torch

from trtllm_gateway.engine.builtin.device_dtype import pick_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_is_float32_on_cpu_and_bfloat16_on_cuda() -> None:
    assert pick_dtype("auto", CPU) is torch.float32
    assert pick_dtype("auto", CPU, "none") is torch.float32
    assert pick_dtype("auto", CUDA) is torch.bfloat16


def test_int8_weights_take_bf16_activations_on_cpu() -> None:
    assert pick_dtype("auto", CPU, "int8") is torch.bfloat16


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)],
)
def test_an_explicit_dtype_wins(name: str, dtype: torch.dtype) -> None:
    assert pick_dtype(name, CPU) is dtype and pick_dtype(name, CUDA, "int8") is dtype
