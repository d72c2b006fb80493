"""ModelConfig: a Llama-family shape from HF config.json (Llama 2/3, Mistral, Qwen2, SmolLM2)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SUPPORTED = {"llama", "mistral", "qwen2"}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        model_type = cfg.get("model_type", "llama")
        if model_type not in SUPPORTED:
            raise ValueError(
                f"model_type {model_type!r} is not supported (have {sorted(SUPPORTED)})"
            )
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        # transformers 5 nests rope settings under rope_parameters; 4.x keeps them top-level.
        rope = dict(cfg.get("rope_parameters") or {})
        scaling = dict(cfg.get("rope_scaling") or {})
        scaling.update({k: v for k, v in rope.items() if k != "rope_theta"})
        if scaling.get("rope_type", scaling.get("type")) in (None, "default"):
            scaling = {}
        theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", False)) or model_type == "qwen2",
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
        )

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        return cls.from_dict(json.loads(path.read_text()))

    def with_generation_eos(self, model_dir: Path) -> ModelConfig:
        """generation_config.json may name more stop ids than config.json (Llama 3 does)."""
        gen = model_dir / "generation_config.json"
        if not gen.is_file():
            return self
        eos = json.loads(gen.read_text()).get("eos_token_id")
        extra = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        ids = tuple(dict.fromkeys(self.eos_token_ids + extra))
        return replace(self, eos_token_ids=ids)

    @property
    def kv_elems_per_token(self) -> int:
        """Elements of K plus V per token across all layers (times the dtype size: bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim
