"""Lazy, checked import of `tensorrt_llm`: the one place that knows how to get it."""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path
from types import ModuleType

from trtllm_gateway.config.disagg import EncodeSiblings
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.config.engine_args import resolve_trtllm_args
from trtllm_gateway.config.trtllm import TrtllmConfig
from trtllm_gateway.engine.protocol import EngineError
from trtllm_gateway.engine.trtllm.lora import LoraAdapters
from trtllm_gateway.engine.trtllm.multimodal import EMBEDDING_MODEL_TYPES

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "--engine trtllm needs TensorRT-LLM 1.2, but `import tensorrt_llm` failed ({reason}). "
    "Run inside the NGC image nvcr.io/nvidia/tensorrt-llm/release:1.2.0 (the Dockerfile's "
    "`trtllm` target), or install the extra on a Linux CUDA 13 host: "
    "pip install 'trtllm-gateway[trtllm]' --extra-index-url https://pypi.nvidia.com"
)


class TrtllmNotInstalledError(EngineError):
    """tensorrt_llm cannot be imported; str() is the one-line install hint."""


def import_trtllm() -> ModuleType:
    """Import and return `tensorrt_llm`; TrtllmNotInstalledError with the install hint if absent.

    Only ImportError is translated: a broken installation that raises something else is a bug
    the operator must see in full.
    """
    try:
        return importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise TrtllmNotInstalledError(INSTALL_HINT.format(reason=exc)) from None


def import_llmapi() -> ModuleType:
    """`tensorrt_llm.llmapi` (configs, RequestError, DisaggregatedParams); after import_trtllm."""
    import_trtllm()
    return importlib.import_module("tensorrt_llm.llmapi")


class TrtllmUnsupportedError(EngineError):
    """A flag combination the TensorRT-LLM adapter refuses at start-up; str() is one line."""


def refuse_unsupported(
    engine: EngineConfig, encoders: EncodeSiblings | None, model: str | None = None
) -> None:
    """Refuse what --engine trtllm does not do, before anything loads: an encode instance
    does not ask another one (--encode-url is for prefill and aggregated instances), and
    --encode-url needs a model whose 1.2 input processor takes precomputed embeddings (any
    other raises NotImplementedError on every request: engine.trtllm.multimodal)."""
    if engine.mode == "encode" and encoders is not None:
        raise TrtllmUnsupportedError(
            "--encode-url is for prefill and aggregated instances, not --mode encode"
        )
    config = Path(model or engine.model) / "config.json"
    if encoders is not None and engine.mode != "encode" and config.is_file():
        model_type = json.loads(config.read_text()).get("model_type")
        if model_type not in EMBEDDING_MODEL_TYPES:
            raise TrtllmUnsupportedError(
                f"--encode-url: TensorRT-LLM 1.2 takes precomputed image embeddings only for "
                f"{', '.join(sorted(EMBEDDING_MODEL_TYPES))} models, not {model_type}"
            )


_TRTLLM_LEVELS = {"debug": "debug", "info": "info", "warning": "warning", "error": "error"}


def set_trtllm_log_level(level: str) -> None:
    """--log-level for TensorRT-LLM's own logger, and (via TLLM_LOG_LEVEL) its workers."""
    name = _TRTLLM_LEVELS.get(level, "info")
    os.environ.setdefault("TLLM_LOG_LEVEL", name.upper())
    try:
        importlib.import_module("tensorrt_llm.logger").logger.set_level(name)
    except (ImportError, AttributeError) as exc:
        logger.warning("cannot set TensorRT-LLM's log level: %r", exc)


def preflight(engine: EngineConfig, trtllm: TrtllmConfig, encoders: EncodeSiblings | None) -> None:
    """What TrtllmEngine() checks, run by the CLI before the server starts (one-line errors).

    Raises TrtllmUnsupportedError, TrtllmNotInstalledError or config's EngineArgsError (also
    for a LoRA adapter TensorRT-LLM could not load: engine.trtllm.lora).
    """
    refuse_unsupported(engine, encoders)
    import_trtllm()
    args = resolve_trtllm_args(engine, trtllm)
    if engine.mode != "encode":
        LoraAdapters.from_config(trtllm, args)
