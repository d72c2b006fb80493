"""uvicorn's httptools protocol with the request head bounded (--max-header-bytes).

httptools (llhttp) parses any head size: it accumulates a header value across reads until its
line ends, so a 128 MB header took 39 s before routing or auth (issue 24). uvicorn's h11 protocol
bounds it (h11_max_incomplete_event_size), and the gateway ran on h11 for that alone; but h11 is
pure Python on every response chunk too: a fake engine streaming one token per chunk moved 11.1-
11.9k chunks a second through one API server on h11 against 13.6-13.9k on httptools (the 2-core
EPYC, docs/benchmarks.md). This protocol keeps httptools and bounds the head itself:

- the bytes of each read after which a message's head is still incomplete are counted (a read
  that completes the head is not, so a body in the same read is never counted as head; the read
  in which a message began may hold the previous message's tail: pipelined requests with large
  bodies, which clients do not send, could be refused), and
- the request line and each header, as the parser hands them over, are counted exactly (a head
  that arrives whole in one read);

past max_head_bytes on either count: 400 "Invalid HTTP request received." and the connection
closed, as for h11's bound (a callback that raises is an httptools.HttpParserError, which
uvicorn/protocols/http/httptools_impl.py, HttpToolsProtocol.data_received, answers so).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadTooLargeError(Exception):
    """Raised inside a parser callback: httptools turns it into HttpParserCallbackError."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    max_head_bytes = 65536

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._fed = 0  # bytes of reads that left the head incomplete
        self._exact = 0  # the request line and headers the parser handed over

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._fed += len(data)
            if self._fed > self.max_head_bytes:
                msg = "Invalid HTTP request received."
                self.logger.warning("%s (request head past %d bytes)", msg, self.max_head_bytes)
                self.send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._fed = self._exact = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def _count(self, n: int) -> None:
        self._exact += n
        if self._exact > self.max_head_bytes:
            raise HeadTooLargeError(f"request head past {self.max_head_bytes} bytes")


def bounded_protocol(max_head_bytes: int) -> type[BoundedHttpToolsProtocol]:
    """The protocol class uvicorn.Config(http=...) takes, bounded at max_head_bytes."""
    return type(
        "BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"max_head_bytes": max_head_bytes}
    )
