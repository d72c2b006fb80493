"""Build the model and fill it: safetensors from an HF directory, or random weights (dummy)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from trtllm_gateway.engine.builtin.fp8_checkpoint import Fp8Checkpoint
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.model_config import ModelConfig

logger = logging.getLogger(__name__)


def iter_safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    for i, f in enumerate(files, 1):
        logger.info("loading weights %d/%d: %s", i, len(files), f.name)
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, st.get_tensor(name)


def build_model(
    cfg: ModelConfig,
    model_dir: Path | None,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    dummy: bool = False,
    seed: int = 0,
    reader: Fp8Checkpoint | None = None,
) -> LlamaModel:
    """reader: holds back an FP8 checkpoint's e4m3 weights and scales (--quantization fp8 reads
    them from it after)."""
    t0 = time.perf_counter()
    with torch.device(device), _no_default_init():
        # One spare position: the overlapped CUDA stepper may compute one token past the limit.
        model = LlamaModel(cfg, max_positions + 1)
    model.to(dtype=dtype)
    model.rope.float()
    if dummy:
        _random_fill(model, seed)
    else:
        assert model_dir is not None
        tensors = iter_safetensors(model_dir)
        model.load_weights(tensors if reader is None else reader.read(tensors))
    model.eval().requires_grad_(False)
    logger.info("model ready in %.1fs (%s, %s)", time.perf_counter() - t0, dtype, device)
    return model


@contextlib.contextmanager
def _no_default_init() -> Iterator[None]:
    """Linear and Embedding skip torch's default initialization: every parameter it would draw is
    overwritten next (load_weights refuses a checkpoint that leaves one out; _random_fill draws
    them all), and on a CPU the draws were 1.1 s of a 5 s load of the 135M model (cProfile,
    kaiming_uniform_ and normal_). Like transformers' no_init_weights; the model is built in
    one thread."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = _skip  # type: ignore[method-assign]
    nn.Embedding.reset_parameters = _skip  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved  # type: ignore[method-assign]


def _skip(self: nn.Module) -> None:
    return None


@torch.no_grad()
def _random_fill(model: LlamaModel, seed: int) -> None:
    """N(0, 0.02) weights, norms at 1, drawn by a generator on the model's device (an 8B model
    takes minutes on a CPU generator, well under a second on a GPU)."""
    dev = model.embed_tokens.weight.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif p.dtype == torch.float32:
            p.normal_(0.0, 0.02, generator=gen)
        else:
            # Draw in float32 and round, a slice at a time, so no full float32 copy is held.
            flat = p.view(-1)
            step = 1 << 26
            for i in range(0, flat.numel(), step):
                part = flat[i : i + step]
                buf = torch.empty(part.shape, dtype=torch.float32, device=dev)
                part.copy_(buf.normal_(0.0, 0.02, generator=gen))
