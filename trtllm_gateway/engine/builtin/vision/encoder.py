"""VisionEncoder: the vision tower and projector of a LLaVA checkpoint, images -> embeddings.

The tower is transformers' own model for the checkpoint's vision_config (CLIPVisionModel for
llava-1.5 / llava-v1.6), the projector transformers' LlavaMultiModalProjector, and preprocessing
the checkpoint's image processor on its PIL path (no torchvision needed). Only these weights are
read from the safetensors files; the language model is ours (engine/builtin/model.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtllm_gateway.engine.builtin.vision.anyres import pack_anyres
from trtllm_gateway.engine.builtin.vision.spec import VisionSpec, read_spec

logger = logging.getLogger(__name__)

_TOWER, _PROJECTOR, _NEWLINE = "vision_tower.", "multi_modal_projector.", "image_newline"


class VisionEncoder(nn.Module):
    def __init__(self, spec: VisionSpec, hf_config: Any, processor: Any) -> None:
        super().__init__()
        from transformers import AutoModel
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        self.spec = spec
        self.processor = processor
        self.patch_grid = hf_config.vision_config.image_size  # llava_next tile size, in pixels
        self.patch_size = hf_config.vision_config.patch_size
        self.vision_tower = AutoModel.from_config(hf_config.vision_config)  # type: ignore[no-untyped-call]
        self.multi_modal_projector = LlavaMultiModalProjector(hf_config)
        self.image_newline: nn.Parameter | None = None
        if spec.kind == "llava_next":
            self.image_newline = nn.Parameter(torch.zeros(spec.text_hidden_size))

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @torch.inference_mode()
    def encode(self, images: Sequence[Any]) -> list[torch.Tensor]:
        """One [num_image_tokens, text_hidden] tensor per PIL image, in order."""
        batch = self.processor(images=list(images), return_tensors="pt")
        pixels = batch["pixel_values"].to(self.device, self.dtype)
        if self.spec.kind == "llava":
            return list(self._project(pixels))
        sizes = [(int(h), int(w)) for h, w in batch["image_sizes"].tolist()]
        return pack_anyres(self, pixels, sizes)

    def _project(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, tokens, text_hidden]: select the feature layer(s), then project."""
        out = self.vision_tower(pixels, output_hidden_states=True, return_dict=True)
        feats = [out.hidden_states[i] for i in self.spec.feature_layers]
        if self.spec.select_strategy == "default":
            feats = [f[:, 1:] for f in feats]
        return self.multi_modal_projector(torch.cat(feats, dim=-1))

    @torch.no_grad()
    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        tower = dict(self.vision_tower.named_parameters())
        tower |= dict(self.vision_tower.named_buffers())
        projector = dict(self.multi_modal_projector.named_parameters())
        loaded: set[str] = set()
        for raw, tensor in weights:
            name = raw.removeprefix("model.")
            if name.startswith(_TOWER):
                key = name.removeprefix(_TOWER)
                # Saved with or without the CLIPVisionModel's "vision_model." level.
                key = key if key in tower else f"vision_model.{key}"
                target = tower.get(key)
            elif name.startswith(_PROJECTOR):
                key = name.removeprefix(_PROJECTOR)
                target = projector.get(key)
            elif name == _NEWLINE and self.image_newline is not None:
                key, target = name, self.image_newline
            else:
                continue
            if target is None:
                continue  # e.g. a tower layer past the selected feature layer's needs
            target.copy_(tensor.to(target.dtype))
            loaded.add(name if name == _NEWLINE else key)
        missing = [n for n in projector if n not in loaded]
        if self.image_newline is not None and _NEWLINE not in loaded:
            missing.append(_NEWLINE)
        if missing or not loaded:
            raise ValueError(f"checkpoint lacks vision weights, e.g. {missing[:3]}")


def iter_vision_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Only the vision tower / projector / newline tensors (never materializes the LM)."""
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                bare = name.removeprefix("model.")
                if bare.startswith((_TOWER, _PROJECTOR)) or bare == _NEWLINE:
                    yield name, st.get_tensor(name)


def load_encoder(model_dir: Path, dtype: torch.dtype, device: torch.device) -> VisionEncoder:
    from transformers import AutoConfig, AutoImageProcessor

    spec = read_spec(model_dir)
    hf_config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    # The PIL backend: exact, and needs no torchvision.
    processor = AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call]
        str(model_dir), local_files_only=True, backend="pil"
    )
    with torch.device(device):
        encoder = VisionEncoder(spec, hf_config, processor)
    encoder.load_weights(iter_vision_tensors(model_dir))
    encoder.to(dtype=dtype).eval().requires_grad_(False)
    logger.info("vision encoder ready: %s, %s", spec.kind, type(processor).__name__)
    return encoder
