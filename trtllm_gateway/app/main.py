"""create_app(config, engine=None): routers, middleware, error handlers, /metrics, the lifespan.

Middleware, outermost first: request context (X-Request-Id, the per-request log line), the body
limit (--max-body-bytes), tracing (only with --otlp-traces-endpoint), CORS (only with
--allowed-origins), HTTP metrics, API keys (only with --api-key), the internal key (every
/internal/ path; 403 without --internal-api-key).
"""

from __future__ import annotations

import os

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.middleware.cors import CORSMiddleware

from trtllm_gateway.app.drain import Drain
from trtllm_gateway.app.lifespan import create_lifespan
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.engine.protocol import EngineBase
from trtllm_gateway.multimodal import create_pixel_budget
from trtllm_gateway.routers import health
from trtllm_gateway.routers.anthropic.messages import router as messages
from trtllm_gateway.routers.internal import disagg, encode, kv_events
from trtllm_gateway.routers.openai import models
from trtllm_gateway.routers.openai.chat import router as chat
from trtllm_gateway.routers.openai.completions import router as completions
from trtllm_gateway.routers.openai.responses import router as responses
from trtllm_gateway.routers.openai.responses.store import ResponseStore, StoreLimits
from trtllm_gateway.web.admission import AdmissionControl
from trtllm_gateway.web.auth import ApiKeyMiddleware, InternalKeyMiddleware, load_api_keys
from trtllm_gateway.web.body_limit import BodyLimitMiddleware
from trtllm_gateway.web.errors import install_error_handlers
from trtllm_gateway.web.metrics import GatewayMetrics
from trtllm_gateway.web.request_context import HEADER, RequestContextMiddleware
from trtllm_gateway.web.shared_counts import SharedCounts
from trtllm_gateway.web.tracing import Tracer, TracingMiddleware
from trtllm_gateway.web.version import VERSION


def create_app(
    config: GatewayConfig, engine: EngineBase | None = None, shared: SharedCounts | None = None
) -> FastAPI:
    """The ASGI app. Without `engine`, the lifespan builds one from config (create_engine).

    `app.state.drain` is the app's Drain; the server (app/server.py) runs it on SIGTERM.
    shared: the admission counters of every API server (--api-server-count, app/api_server.py).
    """
    server = config.server
    admission = AdmissionControl(
        config.engine.max_batch_size,
        server.max_queued_requests,
        server.max_running_choices,
        shared,
    )
    # prometheus_client's own switch: set (by the supervisor) before it was imported.
    multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    metrics = GatewayMetrics(
        CollectorRegistry(), admission, server.metrics_prefix, multiprocess_dir
    )
    metrics.pixels = create_pixel_budget(config.media, shared)
    drain = Drain(admission, server.shutdown_timeout)
    endpoint = server.otlp_traces_endpoint
    tracer = Tracer(endpoint) if endpoint else None
    app = FastAPI(
        title="trtllm-gateway",
        version=VERSION,
        lifespan=create_lifespan(config, engine, metrics, drain, tracer),
    )
    app.state.drain = drain
    app.state.response_store = _response_store(config, shared)
    install_error_handlers(app, on_disconnect=metrics.client_disconnected)
    routers = (chat, completions, responses, messages, models, health, disagg, encode, kv_events)
    for module in routers:
        app.include_router(module.router)
    # add_middleware wraps: the last added runs first.
    internal = config.disagg.internal_api_key
    app.add_middleware(
        InternalKeyMiddleware,
        internal_key=internal.get_secret_value() if internal is not None else None,
    )
    keys = load_api_keys(server)
    if keys:
        app.add_middleware(ApiKeyMiddleware, keys=keys, public_paths=server.public_paths)
    instrumentator = Instrumentator(
        registry=metrics.http_registry,
        excluded_handlers=["/metrics"],
        should_group_status_codes=False,
    ).instrument(app)
    if multiprocess_dir is None:
        instrumentator.expose(app, endpoint="/metrics", include_in_schema=False)
    else:
        # The instrumentator's own /metrics would show the files only, not the engine gauges.
        @app.get("/metrics", include_in_schema=False)
        def _metrics() -> Response:
            return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    if server.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=server.allowed_origins,
            allow_methods=server.allowed_methods,
            allow_headers=server.allowed_headers,
            allow_credentials=server.allow_credentials,
            expose_headers=[HEADER],
        )
    if tracer is not None:  # inside the request context, whose outcome its spans report
        app.add_middleware(TracingMiddleware, tracer=tracer)
    # Inside the request context (its log line and X-Request-Id), outside everything that reads.
    app.add_middleware(BodyLimitMiddleware, max_bytes=server.max_body_bytes)
    app.add_middleware(RequestContextMiddleware, quiet_paths=("/health", "/metrics"))
    return app


def _response_store(config: GatewayConfig, shared: SharedCounts | None) -> ResponseStore:
    """One sqlite file beside the admission counts in the supervisor's run directory (every API
    server reads it: a previous_response_id chain may cross processes), else in memory."""
    serving = config.serving
    limits = StoreLimits(
        serving.response_store_max_count,
        serving.response_store_max_bytes,
        serving.response_store_max_age,
    )
    path = ":memory:" if shared is None else os.path.join(os.path.dirname(shared.path), "responses")
    return ResponseStore(path, limits)
