"""VisionSpec: what a LLaVA-style config.json says about images, and the language model's shape."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trtllm_gateway.engine.builtin.model_config import ModelConfig

VisionKind = Literal["llava", "llava_next"]
SUPPORTED: tuple[VisionKind, ...] = ("llava", "llava_next")


@dataclass(frozen=True, slots=True)
class VisionSpec:
    kind: VisionKind
    image_token_id: int
    feature_layers: tuple[int, ...]  # hidden-state indices concatenated (one for llava-1.5)
    select_strategy: Literal["default", "full"]  # default drops the CLS position
    text_hidden_size: int
    image_grid_pinpoints: tuple[tuple[int, int], ...] = ()  # llava_next "anyres" resolutions

    @property
    def layout(self) -> str:
        """Fingerprint an encode sibling must match: same kind, token id and embedding width."""
        return f"{self.kind}:{self.image_token_id}:{self.text_hidden_size}"


def read_config(model_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    return config


def is_vision_checkpoint(model_dir: Path | None) -> bool:
    if model_dir is None or not (model_dir / "config.json").is_file():
        return False
    return read_config(model_dir).get("model_type") in SUPPORTED


def _hf_config(model_dir: Path) -> Any:
    """transformers' config, so that fields a checkpoint leaves out get the library's defaults."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir), local_files_only=True)


def read_spec(model_dir: Path) -> VisionSpec:
    hf = _hf_config(model_dir)
    if hf.model_type not in SUPPORTED:
        raise ValueError(f"{model_dir} is not a LLaVA checkpoint (model_type {hf.model_type!r})")
    layer = hf.vision_feature_layer
    layers = (int(layer),) if isinstance(layer, int) else tuple(int(x) for x in layer)
    strategy = hf.vision_feature_select_strategy
    if strategy not in ("default", "full"):
        raise ValueError(f"vision_feature_select_strategy {strategy!r} is not supported")
    pinpoints = tuple(
        (int(h), int(w)) for h, w in (getattr(hf, "image_grid_pinpoints", None) or ())
    )
    return VisionSpec(
        kind=hf.model_type,
        image_token_id=int(hf.image_token_id),
        feature_layers=layers,
        select_strategy=strategy,
        text_hidden_size=int(hf.text_config.hidden_size),
        image_grid_pinpoints=pinpoints,
    )


def language_config(model_dir: Path) -> ModelConfig:
    """The language model's shape: config.json, or its text_config for a LLaVA checkpoint."""
    if not is_vision_checkpoint(model_dir):
        return ModelConfig.from_file(model_dir / "config.json")
    text = _hf_config(model_dir).text_config.to_dict()
    return ModelConfig.from_dict(text)
