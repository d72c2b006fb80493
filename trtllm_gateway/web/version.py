"""The installed package version (falls back to pyproject's when run from a checkout)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("trtllm-gateway")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    VERSION = "0.1.0"
