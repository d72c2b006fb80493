"""A real loopback HTTP server (http.server in a thread, port 0) and image helpers for tests."""

from __future__ import annotations

import contextlib
import io
import socketserver
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from PIL import Image


def png_bytes(width: int = 4, height: int = 3, mode: str = "RGB", color: object = "red") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height), color).save(buf, format="PNG")  # type: ignore[arg-type]
    return buf.getvalue()


class _QuickHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn): slow with no network.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", int(self.server_address[1])


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    content_type: str | None = "image/png"
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False
    chunk_count: int = 1  # chunked: the body is sent this many times
    chunk_delay: float = 0.0  # chunked: pause before each chunk
    delay: float = 0.0


@dataclass
class Seen:
    path: str
    headers: dict[str, str]


class ImageServer:
    """Serves Routes on 127.0.0.1:<free port> and records every request it receives."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[Seen] = []
        self.got_request = threading.Event()
        self._stop = threading.Event()
        self._httpd = _QuickHTTPServer(("127.0.0.1", 0), self._handler_class())
        if ssl_context is not None:
            self._httpd.socket = ssl_context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> ImageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.requests.append(
                    Seen(self.path, {k.lower(): v for k, v in self.headers.items()})
                )
                server.got_request.set()
                route = server.routes.get(self.path, Route(status=404, content_type="text/plain"))
                with contextlib.suppress(OSError):  # the client gave up (size cap, timeout)
                    self._serve(route)

            def _serve(self, route: Route) -> None:
                if route.delay and server._stop.wait(route.delay):
                    return
                self.send_response(route.status)
                if route.content_type is not None:
                    self.send_header("Content-Type", route.content_type)
                for name, value in route.headers.items():
                    self.send_header(name, value)
                if route.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for _ in range(route.chunk_count):
                        if route.chunk_delay and server._stop.wait(route.chunk_delay):
                            return
                        self.wfile.flush()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(route.body), route.body))
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if "Content-Length" not in route.headers:
                    self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                self.wfile.write(route.body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def server() -> Iterator[ImageServer]:
    with ImageServer() as s:
        yield s


async def test_server_serves_and_records(server: ImageServer) -> None:
    server.routes["/a.png"] = Route(body=png_bytes())
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(server.url("/a.png"))
    assert response.status_code == 200
    assert response.content == png_bytes()
    assert [seen.path for seen in server.requests] == ["/a.png"]
