"""Lazy, checked import of `tensorrt_llm`: the one place that knows how to get it."""

from __future__ import annotations

import importlib
from types import ModuleType

from engine.protocol import EngineError

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
