"""create_app(settings, engine=None): routers, error handlers, /metrics and the lifespan."""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator

from app.errors import install_error_handlers
from app.lifespan import create_lifespan
from app.metrics import GatewayMetrics
from app.version import VERSION
from config.settings import Settings
from engine.protocol import Engine
from app.forwarding import ForwardCallerAuth
from routers import chat, completions, disagg, health, models


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    """The ASGI app. Without `engine`, the lifespan builds one from settings (create_engine)."""
    metrics = GatewayMetrics(CollectorRegistry())
    app = FastAPI(
        title="trtllm-gateway",
        version=VERSION,
        lifespan=create_lifespan(settings, engine, metrics),
    )
    install_error_handlers(app, on_disconnect=metrics.client_disconnected)
    for module in (chat, completions, models, health, disagg):
        app.include_router(module.router)
    app.add_middleware(ForwardCallerAuth)
    Instrumentator(registry=metrics.registry, excluded_handlers=["/metrics"]).instrument(
        app
    ).expose(app, endpoint="/metrics", include_in_schema=False)
    return app
