"""EncodeOnly: what an encode instance (EPD, --mode encode) is of an engine: an EngineBase.

It serves no generation (not an Engine: the app answers generation routes 400 on it): both
engines' encode instances (engine/builtin/vision/encode_engine.py, engine/trtllm/encode.py) take
this base and add start/stop and `encode_images` (ImageEncoding), the sibling encode endpoint's
one call.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_gateway.engine.capabilities import EngineExtras
from trtllm_gateway.engine.protocol import (
    EngineDeadError,
    EngineHealth,
    EngineInfo,
    EngineState,
)


class EncodeOnly:
    info: EngineInfo
    tokenizer_dir: Path | None = None
    _state: EngineState = "loading"
    _detail: str = ""

    @property
    def extras(self) -> EngineExtras:
        return EngineExtras(tokenizer_dir=self.tokenizer_dir)

    def health(self) -> EngineHealth:
        return EngineHealth(state=self._state, detail=self._detail)

    def _require_ready(self) -> None:
        if self._state != "ready":
            raise EngineDeadError(self._detail or f"the vision encoder is {self._state}")
