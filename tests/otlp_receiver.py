"""A real OTLP/HTTP trace receiver for tests: POST /v1/traces, protobuf, as the collector takes it.

Each body is decoded with opentelemetry-proto's ExportTraceServiceRequest (the collector's own
message) and answered with an empty ExportTraceServiceResponse; the spans are kept, flattened
with their resource's attributes.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    start_ns: int
    end_ns: int


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: list[str] = field(default_factory=list)  # content types seen
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._add(self.headers.get("Content-Type", ""), body)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _add(self, content_type: str, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self._lock:
            self.posts.append(content_type)
            for rs in req.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            ReceivedSpan(
                                name=s.name,
                                kind=s.kind,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                resource=resource,
                                status_code=s.status.code,
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                            )
                        )

    def wait_for(
        self, match: Callable[[ReceivedSpan], bool], count: int = 1, timeout: float = 20.0
    ) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = [s for s in self.spans if match(s)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)
