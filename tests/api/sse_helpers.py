"""Helpers for reading SSE transcripts in api tests."""

from __future__ import annotations

import json
from typing import Any


def parse_sse(body: str) -> list[Any]:
    """Every `data:` payload in order: decoded JSON, or the string "[DONE]"."""
    events: list[Any] = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def chat_text(events: list[Any], index: int = 0) -> str:
    return "".join(
        c["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and "choices" in e
        for c in e["choices"]
        if c["index"] == index
    )
