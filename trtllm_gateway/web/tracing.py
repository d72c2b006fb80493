"""OpenTelemetry traces (--otlp-traces-endpoint), as vLLM emits them: one span per request.

Off by default, and then nothing of the OpenTelemetry SDK is imported and no middleware runs:
`trace_headers()` and `annotate()` read a contextvar that stays empty. On, TracingMiddleware
(inside the request context, so it reads the request's outcome there) opens a SERVER span per
generation request: "llm_request" for /v1/chat/completions and /v1/completions (vLLM's name),
"prefill" and "encode" for a sibling's /internal/v1/prefill (or v2) and /internal/v1/encode. A W3C
`traceparent` (and `tracestate`) from the caller makes it a child of the caller's span; the
request's own calls to siblings carry this span's traceparent (GenerateRequest.trace_headers),
so a remote prefill or encode is a child span on the other instance.

Attributes are vLLM's (vllm/tracing.py SpanAttributes; OpenTelemetry's gen_ai conventions):
the request id, model, prompt and completion tokens, TTFT, end-to-end latency, the engine's
queue, prefill, decode and inference times, the sampling knobs the request set and its finish
reasons. Spans leave through the OTLP/HTTP protobuf exporter in batches
(OTEL_BSP_SCHEDULE_DELAY and the SDK's other OTEL_* variables apply).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtllm_gateway.engine.disagg.sibling_wire import ENCODE_PATH, PREFILL_PATH, PREFILL_V2_PATH
from trtllm_gateway.web import request_context

SPAN_NAMES = {
    "/v1/chat/completions": "llm_request",
    "/v1/completions": "llm_request",
    PREFILL_PATH: "prefill",
    PREFILL_V2_PATH: "prefill",  # protocol v2's context phase (issue 41)
    ENCODE_PATH: "encode",
}
W3C_HEADERS = ("traceparent", "tracestate")
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
# How long shutdown waits for the last spans to leave. A live collector takes milliseconds; a
# dead one made the SDK retry for its whole export timeout (10 s), and SIGTERM took 12.7 s
# instead of 3.0 s (issue 40, item 8).
FLUSH_ON_SHUTDOWN_S = 2.0

logger = logging.getLogger(__name__)


class SpanAttributes:
    """vLLM's names (vllm/tracing.py), so dashboards built on vLLM's traces read ours."""

    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"


_outgoing: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("trace_headers", default=())
_span: ContextVar[Any] = ContextVar("trace_span", default=None)


def trace_headers() -> tuple[tuple[str, str], ...]:
    """The W3C headers this request's sibling calls carry: empty when tracing is off."""
    return _outgoing.get()


def active() -> bool:
    """Whether this request has a span (callers skip building attributes otherwise)."""
    return _span.get() is not None


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set attributes on this request's span, if it has one (None values are left out)."""
    span = _span.get()
    if span is not None:
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP URL: a bare collector address gets the traces path (/v1/traces)."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--otlp-traces-endpoint {endpoint!r} is not an http(s) URL")
    return endpoint if parts.path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"


class Tracer:
    """The process's TracerProvider and OTLP/HTTP exporter; shutdown() flushes what is queued."""

    def __init__(self, endpoint: str) -> None:
        import os

        # OTEL_SERVICE_NAME names each process, as NVIDIA Dynamo's launchers set it per worker.
        service_name = os.environ.get("OTEL_SERVICE_NAME") or "trtllm-gateway"
        protocol = os.environ.get(PROTOCOL_ENV, "http/protobuf")
        if protocol != "http/protobuf":
            raise ValueError(
                f"{PROTOCOL_ENV}={protocol}: this gateway exports OTLP over HTTP/protobuf only "
                "(the collector's port 4318)"
            )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.url = traces_url(endpoint)
        resource = Resource.create({"service.name": service_name})
        self._provider = TracerProvider(resource=resource)
        self._exporter = OTLPSpanExporter(endpoint=self.url)
        self._provider.add_span_processor(BatchSpanProcessor(self._exporter))
        self._tracer = self._provider.get_tracer("trtllm_gateway")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, name: str, headers: Headers) -> tuple[Any, tuple[tuple[str, str], ...]]:
        """A SERVER span continuing the caller's W3C context, and the headers for its calls."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        carrier = {h: headers[h] for h in W3C_HEADERS if h in headers}
        parent = self._propagator.extract(carrier) if carrier else None
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER)
        out: dict[str, str] = {}
        self._propagator.inject(out, context=set_span_in_context(span))
        return span, tuple(out.items())

    def shutdown(self, timeout_s: float = FLUSH_ON_SHUTDOWN_S) -> None:
        """Flush what is queued for at most timeout_s, then give up on it.

        The SDK's own shutdown takes no deadline (BatchSpanProcessor.shutdown waits out the
        exporter's retries), so it runs on a daemon thread; past the deadline the exporter is
        shut, which ends its retry loop at its next back-off (opentelemetry-exporter-otlp's
        _OTLPHTTPClient.export waits on its shutdown event), and the rest of the spans are
        dropped."""
        flush = threading.Thread(target=self._provider.shutdown, name="otel-flush", daemon=True)
        flush.start()
        flush.join(timeout_s)
        if flush.is_alive():
            logger.warning(
                "traces: the collector at %s took no spans within %.0f s; the rest are dropped",
                self.url,
                timeout_s,
            )
            self._exporter.shutdown()  # type: ignore[no-untyped-call]


class TracingMiddleware:
    """One span per generation request; its attributes from the request context at the end."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = SPAN_NAMES.get(scope["path"]) if scope["type"] == "http" else None
        if name is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        span, outgoing = self.tracer.start(name, Headers(scope=scope))
        tokens = (_span.set(span), _outgoing.set(outgoing))
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            _finish(span, status, time.monotonic() - start)
            _span.reset(tokens[0])
            _outgoing.reset(tokens[1])


def _finish(span: Any, status: int, e2e_s: float) -> None:
    from opentelemetry.trace import Status, StatusCode

    a = SpanAttributes
    attrs: dict[str, Any] = {a.GEN_AI_LATENCY_E2E: e2e_s, "http.response.status_code": status}
    ctx = request_context.current()
    if ctx is not None:
        attrs[a.GEN_AI_REQUEST_ID] = ctx.request_id
        if ctx.model is not None:
            attrs[a.GEN_AI_RESPONSE_MODEL] = ctx.model
            attrs[a.GEN_AI_USAGE_PROMPT_TOKENS] = ctx.prompt_tokens
            attrs[a.GEN_AI_USAGE_COMPLETION_TOKENS] = ctx.completion_tokens
        if ctx.ttft_s is not None:
            attrs[a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] = ctx.ttft_s
        if ctx.finish_reasons:
            attrs[a.GEN_AI_RESPONSE_FINISH_REASONS] = list(ctx.finish_reasons)
        t = ctx.timings
        if t is not None:
            attrs[a.GEN_AI_LATENCY_TIME_IN_QUEUE] = t.queue_s
            attrs[a.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL] = t.prefill_s
            attrs[a.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE] = t.decode_s
            attrs[a.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE] = t.prefill_s + t.decode_s
    span.set_attributes(attrs)
    if status >= 500 or (ctx is not None and ctx.disconnected):
        span.set_status(Status(StatusCode.ERROR))
    span.end()
