"""State: everything that lives for the process, created by the lifespan and read through deps."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from app.metrics import GatewayMetrics
from config.settings import Settings
from engine.protocol import Engine, EngineHealth
from engine.tokenizer import Tokenizer


@dataclass
class State:
    settings: Settings
    engine: Engine
    metrics: GatewayMetrics
    http: httpx.AsyncClient
    tokenizer: Tokenizer | None = None
    start_error: str | None = None
    draining: bool = False
    _model_name: str | None = field(default=None, repr=False)

    @property
    def model_name(self) -> str:
        """The served name: --served-model-name, else the engine's model id once it is known."""
        if self.settings.served_model_name:
            return self.settings.served_model_name
        if self._model_name is None:
            info = getattr(self.engine, "info", None)
            if info is None:
                return self.settings.model
            self._model_name = info.model_id
        return self._model_name

    def health(self) -> EngineHealth:
        """Engine health folded with the gateway's own: not ready until the tokenizer is loaded."""
        if self.start_error is not None:
            return EngineHealth(state="dead", detail=self.start_error)
        health = self.engine.health()
        if self.draining and health.state == "ready":
            return EngineHealth(state="draining", running=health.running, waiting=health.waiting)
        if health.state == "ready" and self.tokenizer is None:
            return EngineHealth(state="loading", detail="loading the tokenizer")
        return health
