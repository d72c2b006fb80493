"""--otlp-traces-endpoint: one span per request, exported to a real OTLP/HTTP receiver.

The receiver (tests/otlp_receiver.py) decodes what arrives with opentelemetry-proto's
ExportTraceServiceRequest, as the collector does. A W3C traceparent from the client makes the
span its child; the engine request carries this span's context for sibling calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.ops_helpers import CHAT
from tests.fake_engine import FakeEngine
from tests.otlp_receiver import OtlpReceiver
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import GenerateRequest

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def settings(
    settings: Settings, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the SDK's batch delay, ms
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    return settings.model_copy(update={"otlp_traces_endpoint": receiver.url})


@pytest.fixture
def seen(fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> list[GenerateRequest]:
    requests: list[GenerateRequest] = []
    generate = fake_engine.generate

    def record(req: GenerateRequest) -> Any:
        requests.append(req)
        return generate(req)

    monkeypatch.setattr(fake_engine, "generate", record)
    return requests


async def test_span_continues_the_client_trace_with_vllms_attributes(
    client: httpx.AsyncClient, receiver: OtlpReceiver, seen: list[GenerateRequest]
) -> None:
    body = {**CHAT, "temperature": 0.5, "top_p": 0.9, "stream": True}
    r = await client.post("/v1/chat/completions", json=body, headers={"traceparent": TRACEPARENT})
    assert r.status_code == 200
    (span,) = receiver.wait_for(lambda s: s.name == "llm_request")
    assert receiver.posts == ["application/x-protobuf"] * len(receiver.posts)
    assert (span.trace_id, span.parent_span_id, span.kind) == (TRACE_ID, PARENT_ID, SERVER)
    assert span.resource["service.name"] == "trtllm-gateway"
    a = span.attributes
    assert a["gen_ai.request.id"] == r.headers["x-request-id"]
    assert a["gen_ai.response.model"] == CHAT["model"]
    assert a["gen_ai.usage.completion_tokens"] == 8 and a["gen_ai.usage.prompt_tokens"] > 0
    assert (a["gen_ai.request.temperature"], a["gen_ai.request.top_p"]) == (0.5, 0.9)
    assert a["gen_ai.request.max_tokens"] == 8 and a["gen_ai.request.n"] == 1
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert 0 < a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    for name in ("time_in_queue", "time_in_model_prefill", "time_in_model_decode"):
        assert a[f"gen_ai.latency.{name}"] >= 0  # the engine's Timings (the fake's are zeros)
    # The engine request carries this span's context for its calls to siblings.
    (req,) = seen
    headers = dict(req.trace_headers)
    assert headers["traceparent"] == f"00-{TRACE_ID}-{span.span_id}-01"


async def test_a_request_without_traceparent_starts_a_trace(
    client: httpx.AsyncClient, receiver: OtlpReceiver
) -> None:
    r = await client.post("/v1/completions", json={"model": CHAT["model"], "prompt": "x"})
    assert r.status_code == 200
    (span,) = receiver.wait_for(lambda s: s.name == "llm_request")
    assert span.parent_span_id == "" and len(span.trace_id) == 32
    assert span.attributes["gen_ai.request.id"] == r.json()["id"]
    await client.get("/v1/models")  # not a generation request: no span
    assert len(receiver.wait_for(lambda s: True, count=2, timeout=0.5)) == 1


def test_off_by_default_imports_no_sdk() -> None:
    code = (
        "import sys\n"
        "from trtllm_gateway.app.main import create_app\n"
        "from trtllm_gateway.config.settings import Settings\n"
        "from trtllm_gateway.routers.openai import run\n"
        "create_app(Settings().parts())\n"
        "bad = [m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
        "'opentelemetry.exporter'))]\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr


def test_endpoint_url_and_protocol_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtllm_gateway.web.tracing import Tracer, traces_url

    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://c:4318/custom/path") == "http://c:4318/custom/path"
    with pytest.raises(ValueError, match="not an http"):
        traces_url("collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    with pytest.raises(ValueError, match="HTTP/protobuf only"):
        Tracer("http://collector:4318")
