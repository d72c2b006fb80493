"""create_app(settings, engine=None): routers, middleware, error handlers, /metrics, the lifespan.

Middleware, outermost first: request context (X-Request-Id, the per-request log line), the body
limit (--max-body-bytes), tracing (only with --otlp-traces-endpoint), CORS (only with
--allowed-origins), HTTP metrics, API keys (only with --api-key), the internal key (every
/internal/ path; 403 without --internal-api-key).
"""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.middleware.cors import CORSMiddleware

from trtllm_gateway.app import health
from trtllm_gateway.app.admission import Admission
from trtllm_gateway.app.auth import ApiKeyMiddleware, InternalKeyMiddleware, load_api_keys
from trtllm_gateway.app.body_limit import BodyLimitMiddleware
from trtllm_gateway.app.drain import Drain
from trtllm_gateway.app.errors import install_error_handlers
from trtllm_gateway.app.lifespan import create_lifespan
from trtllm_gateway.app.metrics import GatewayMetrics
from trtllm_gateway.app.request_context import HEADER, RequestContextMiddleware
from trtllm_gateway.app.tracing import Tracer, TracingMiddleware
from trtllm_gateway.app.version import VERSION
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import EngineBase
from trtllm_gateway.internal_api import disagg, encode, kv_events
from trtllm_gateway.multimodal import create_pixel_budget
from trtllm_gateway.openai import models
from trtllm_gateway.openai.chat import router as chat
from trtllm_gateway.openai.completions import router as completions


def create_app(settings: Settings, engine: EngineBase | None = None) -> FastAPI:
    """The ASGI app. Without `engine`, the lifespan builds one from settings (create_engine).

    `app.state.drain` is the app's Drain; the server (app/server.py) runs it on SIGTERM.
    """
    admission = Admission(
        settings.max_batch_size, settings.max_queued_requests, settings.max_running_choices
    )
    metrics = GatewayMetrics(CollectorRegistry(), admission, settings.metrics_prefix)
    metrics.pixels = create_pixel_budget(settings)
    drain = Drain(admission, settings.shutdown_timeout)
    endpoint = settings.otlp_traces_endpoint
    tracer = Tracer(endpoint) if endpoint else None
    app = FastAPI(
        title="trtllm-gateway",
        version=VERSION,
        lifespan=create_lifespan(settings, engine, metrics, drain, tracer),
    )
    app.state.drain = drain
    install_error_handlers(app, on_disconnect=metrics.client_disconnected)
    for module in (chat, completions, models, health, disagg, encode, kv_events):
        app.include_router(module.router)
    # add_middleware wraps: the last added runs first.
    internal = settings.internal_api_key
    app.add_middleware(
        InternalKeyMiddleware,
        internal_key=internal.get_secret_value() if internal is not None else None,
    )
    keys = load_api_keys(settings)
    if keys:
        app.add_middleware(ApiKeyMiddleware, keys=keys, public_paths=settings.public_paths)
    Instrumentator(
        registry=metrics.registry, excluded_handlers=["/metrics"], should_group_status_codes=False
    ).instrument(app).expose(app, endpoint="/metrics", include_in_schema=False)
    if settings.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.allowed_origins,
            allow_methods=settings.allowed_methods,
            allow_headers=settings.allowed_headers,
            allow_credentials=settings.allow_credentials,
            expose_headers=[HEADER],
        )
    if tracer is not None:  # inside the request context, whose outcome its spans report
        app.add_middleware(TracingMiddleware, tracer=tracer)
    # Inside the request context (its log line and X-Request-Id), outside everything that reads.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestContextMiddleware, quiet_paths=("/health", "/metrics"))
    return app
