"""EngineInfo for a TensorRT-LLM model, read from its local HF config (never the hub)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from trtllm_gateway.config.mode import Mode
from trtllm_gateway.engine.image_resize import resize_edge
from trtllm_gateway.engine.protocol import EngineInfo

logger = logging.getLogger(__name__)

DEFAULT_MAX_LEN = 4096


def read_engine_info(
    model: str,
    *,
    served_name: str | None,
    mode: Mode,
    max_seq_len: int | None,
    trust_remote_code: bool,
    kv_cache: dict[str, Any] | None = None,
) -> EngineInfo:
    """Model id, context length, vocabulary and EOS ids from `model`'s config.json (plus the
    extra EOS ids of generation_config.json: Llama-3.x ends a turn with one of those).

    kv_layout names what prefill and decode siblings must share for TensorRT-LLM's cache
    transceiver: the model, the KV dtype and tokens_per_block (kv_cache: the merged
    kv_cache_config; unset values are TensorRT-LLM's defaults, "auto" and 32).

    A hub id that is not on local disk gives conservative defaults (logged): TensorRT-LLM
    downloads it itself, and the gateway's tokenizer supplies the real EOS ids.
    """
    config = _load_config(model, trust_remote_code)
    text = getattr(config, "text_config", None) or config
    vocab = int(getattr(text, "vocab_size", 0) or getattr(config, "vocab_size", 0) or 0)
    eos = getattr(text, "eos_token_id", None) or getattr(config, "eos_token_id", None)
    eos_ids = (*_ids(eos), *_ids(_generation_eos(model)))
    model_len = getattr(text, "max_position_embeddings", None) or DEFAULT_MAX_LEN
    if max_seq_len is not None:
        model_len = min(int(model_len), max_seq_len) if model_len else max_seq_len
    images = getattr(config, "vision_config", None) is not None
    return EngineInfo(
        model_id=served_name or _model_id(model),
        max_model_len=int(model_len),
        vocab_size=vocab,
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        supports_images=images,
        image_resize_edge=resize_edge(model) if images else 0,
        mode=mode,
        engine="trtllm",
        kv_layout=_kv_layout(model, kv_cache or {}),
    )


def _load_config(model: str, trust_remote_code: bool) -> Any:
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(
            model, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        logger.warning(
            "no local config for %s (%s); using defaults until tokenizer loads", model, exc
        )
        return object()


def _model_id(model: str) -> str:
    path = Path(model)
    return path.name if path.is_dir() else model


def _kv_layout(model: str, kv_cache: dict[str, Any]) -> str:
    dtype = kv_cache.get("dtype") or "auto"
    block = kv_cache.get("tokens_per_block") or 32
    return f"trtllm:{_model_id(model)}:kv={dtype}:block={block}"


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value)
    return () if value is None else (int(value),)


def _generation_eos(model: str) -> Any:
    path = Path(model) / "generation_config.json"
    try:
        return json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    except (OSError, ValueError, AttributeError) as exc:
        logger.warning("ignoring unreadable %s: %s", path, exc)
        return None
