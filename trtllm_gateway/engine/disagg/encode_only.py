"""EncodeOnly: what an encode instance (EPD, --mode encode) has of the Engine protocol.

It serves no generation: both engines' encode instances (engine/builtin/vision/encode_engine.py,
engine/trtllm/encode.py) take this base and add start/stop and `encode_images`, the sibling
encode endpoint's one call (routers/encode.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from trtllm_gateway.engine.protocol import (
    EngineDeadError,
    EngineExtras,
    EngineHealth,
    EngineInfo,
    EngineState,
    GenerateRequest,
    InvalidRequestError,
    PrefillResult,
    TokenEvent,
)

ENCODE_ONLY = "an encode instance only runs the vision encoder; send requests to its siblings"


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

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        raise InvalidRequestError(ENCODE_ONLY)
        yield  # an async generator, as the protocol says  # pragma: no cover

    async def prefill(self, req: GenerateRequest) -> PrefillResult:
        raise InvalidRequestError(ENCODE_ONLY)

    def abort(self, request_id: str) -> None:
        """Nothing to abort: encode requests run inside their HTTP request."""

    def _require_ready(self) -> None:
        if self._state != "ready":
            raise EngineDeadError(self._detail or f"the vision encoder is {self._state}")
