"""Build the model and fill it: safetensors from an HF directory, or random weights (dummy)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.builtin.model import LlamaModel
from engine.builtin.model_config import ModelConfig

log = logging.getLogger(__name__)


def iter_safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    for i, f in enumerate(files, 1):
        log.info("loading weights %d/%d: %s", i, len(files), f.name)
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
) -> LlamaModel:
    t0 = time.perf_counter()
    with torch.device(device):
        model = LlamaModel(cfg, max_positions)
    model.to(dtype=dtype)
    model.rope.float()
    if dummy:
        _random_fill(model, seed)
    else:
        assert model_dir is not None
        model.load_weights(iter_safetensors(model_dir))
    model.eval().requires_grad_(False)
    log.info("model ready in %.1fs (%s, %s)", time.perf_counter() - t0, dtype, device)
    return model


@torch.no_grad()
def _random_fill(model: LlamaModel, seed: int) -> None:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(0.02))
