"""Logging setup: every line carries the request_id; --log-format json makes each line one object.

The end-of-request line (logger trtllm_gateway.access) puts its fields in `record.fields`: merged
into the object
in json format, appended as a JSON object in text format, so it is machine-readable either way.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from trtllm_gateway.web.request_context import current_request_id


class RequestIdFilter(logging.Filter):
    """Stamps record.request_id from the request context ("-" outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = current_request_id()
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str = "") -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            **({"process": self.process} if self.process else {}),
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self, process: str = "") -> None:
        where = f"{process} " if process else ""
        super().__init__(f"%(asctime)s {where}%(levelname)s %(name)s [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            line += " " + json.dumps(fields, default=str, ensure_ascii=False)
        return line


def configure_logging(level: str, fmt: str = "text", process: str = "") -> None:
    """One stderr handler on the root logger; uvicorn's loggers propagate to it.

    process: which process of several writes the line ("api-server-1" with --api-server-count).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    formatter = JsonFormatter(process) if fmt == "json" else TextFormatter(process)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True
