"""Where the built-in engine's weights live and in which dtype: the --device and --dtype "auto"
rules, shared by the language model's loader and the encode-only vision engine."""

from __future__ import annotations

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    """A CUDA device always with its index ("cuda" is the current one): torch.cuda.set_device
    refuses a bare "cuda", and the KV transfer thread sets its device at its start."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return with_index(torch.device(name))


def with_index(device: torch.device) -> torch.device:
    """cuda -> cuda:N, N the current device; any other device as it is."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def pick_dtype(name: str, device: torch.device, quantization: str | None = None) -> torch.dtype:
    """auto: bf16 on CUDA; float32 on CPU, except with --quantization int8, whose int8 kernel
    wants bf16 activations. bf16 is about twice as fast on CPUs with native bf16 dot products
    at batch 8 and 32 (docs/benchmarks.md, "CPU dtype"), but its rounding flips greedy tokens of
    a small model: SmolLM2-135M answered "What is the capital of France?" with "L'Etoile, la
    Marseillaise, ..." in bf16 and "The capital of France is Paris." in float32 (HF transformers'
    float32 answer), and a request's greedy text then depended on what it was batched with.
    Ask for --dtype bfloat16 to trade that for speed."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda" or quantization == "int8":
        return torch.bfloat16
    return torch.float32
