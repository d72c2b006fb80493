"""FastAPI dependencies: Annotated aliases over the lifespan State (request.state.gateway)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from trtllm_gateway.config.mode import Mode
from trtllm_gateway.config.serving import ServingConfig
from trtllm_gateway.engine.protocol import Engine, EngineBase, EngineInfo
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.web.admission import AdmissionControl
from trtllm_gateway.web.errors import BadRequestError, ServiceUnavailableError
from trtllm_gateway.web.metrics import GatewayMetrics
from trtllm_gateway.web.state import State

_NOT_READY = {
    "loading": "The model is still loading; retry shortly.",
    "draining": "The server is shutting down.",
    "dead": "The engine has failed and serves no requests.",
}


def get_state(request: Request) -> State:
    state: State = request.state.gateway
    return state


StateDep = Annotated[State, Depends(get_state)]


def get_serving_config(state: StateDep) -> ServingConfig:
    return state.config.serving


ServingConfigDep = Annotated[ServingConfig, Depends(get_serving_config)]


@dataclass(frozen=True, slots=True)
class Serving:
    """A ready engine and everything a generation route needs, typed without Optionals."""

    engine: Engine
    info: EngineInfo
    tokenizer: Tokenizer
    metrics: GatewayMetrics
    config: ServingConfig  # the OpenAI layer's part of the configuration
    mode: Mode
    model_name: str
    admission: AdmissionControl


def get_ready_engine(state: StateDep) -> EngineBase:
    """Raises 503 (OpenAI error body) unless the engine is ready to take requests."""
    health = state.health()
    if health.state != "ready" or state.tokenizer is None:
        message = _NOT_READY.get(health.state, _NOT_READY["loading"])
        raise ServiceUnavailableError(message, code=f"engine_{health.state}")
    return state.engine


ReadyEngineDep = Annotated[EngineBase, Depends(get_ready_engine)]


def get_serving(state: StateDep, engine: ReadyEngineDep) -> Serving:
    """A ready engine that serves requests: 503 unless ready, 400 on an encode instance."""
    assert state.tokenizer is not None  # get_ready_engine checked it
    if not isinstance(engine, Engine):
        raise BadRequestError(
            "This instance only runs the vision encoder (--mode encode); send requests to the "
            "instances it encodes for."
        )
    return Serving(
        engine=engine,
        info=engine.info,
        tokenizer=state.tokenizer,
        metrics=state.metrics,
        config=state.config.serving,
        mode=state.config.mode,
        model_name=state.model_name,
        admission=state.admission,
    )


ServingDep = Annotated[Serving, Depends(get_serving)]
