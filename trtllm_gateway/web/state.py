"""State: everything that lives for the process, created by the lifespan and read through deps."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import httpx

from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.engine.disagg.kv_nixl import NixlEnd
from trtllm_gateway.engine.protocol import EngineBase, EngineHealth
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.multimodal import MediaCache
from trtllm_gateway.web.admission import AdmissionControl
from trtllm_gateway.web.metrics import GatewayMetrics
from trtllm_gateway.web.prefill_queue import PrefillQueue


@dataclass
class State:
    config: GatewayConfig
    engine: EngineBase
    metrics: GatewayMetrics
    http: httpx.AsyncClient
    tokenizer: Tokenizer | None = None
    # The local directory the tokenizer came from: /v1/models `root`, as vLLM puts the model
    # path there, so clients that tokenize locally (AIPerf, guidellm) can find it.
    tokenizer_path: str | None = None
    start_error: str | None = None
    draining: bool = False
    # Decoded images by content hash (multimodal/); its counters are metrics.media.
    media_cache: MediaCache = field(default_factory=lambda: MediaCache(0))
    # Context phases in flight on a prefill instance (routers/internal/disagg.py).
    prefill_queue: PrefillQueue = field(default_factory=lambda: PrefillQueue(None))
    # A prefill instance's NIXL agent, made at a decode sibling's first GET of it.
    nixl: NixlEnd = field(default_factory=lambda: NixlEnd("prefill"))
    # Set once every API server of --api-server-count N has loaded (SharedCounts.servers_ready).
    _servers_ready: bool = field(default=False, repr=False)
    _model_name: str | None = field(default=None, repr=False)
    _stopping: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def admission(self) -> AdmissionControl:
        return self.metrics.admission

    async def stop_engine(self) -> None:
        """Stop the engine once (drain and lifespan both call this); aborts what is in flight."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self.engine.stop())
        await asyncio.shield(self._stopping)

    @property
    def model_name(self) -> str:
        """The served name: --served-model-name, else the engine's model id once it is known."""
        if self.config.engine.served_model_name:
            return self.config.engine.served_model_name
        if self._model_name is None:
            info = getattr(self.engine, "info", None)
            if info is None:
                return self.config.engine.model
            self._model_name = info.model_id
        return self._model_name

    def health(self) -> EngineHealth:
        """Engine health folded with the gateway's own: not ready until the tokenizer is loaded."""
        if self.start_error is not None:
            return EngineHealth(state="dead", detail=self.start_error)
        health = self.engine.health()
        if self.draining and health.state == "ready":
            return replace(health, state="draining", detail="")
        if health.state == "ready" and self.tokenizer is None:
            return EngineHealth(state="loading", detail="loading the tokenizer")
        if health.state == "ready" and not self._servers_ready:
            shared = self.admission.shared
            ready, servers = shared.servers_ready() if shared is not None else (1, 1)
            if ready < servers:
                # Any server may take the next connection: ready only when every one is.
                detail = f"waiting for the other API servers ({ready} of {servers} loaded)"
                return EngineHealth(state="loading", detail=detail)
            self._servers_ready = True
        return health
