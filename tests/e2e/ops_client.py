"""Streaming helpers for the operations e2e tests: read a chat stream's finish reasons and
[DONE], with the first content chunk signalled so a test can act mid-stream."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

MODEL = "SmolLM2-135M-Instruct"
# The sibling and router endpoints' credential (--internal-api-key); /internal/ takes nothing else.
INTERNAL_KEY = "e2e-internal-key"
INTERNAL_AUTH = {"Authorization": f"Bearer {INTERNAL_KEY}"}


def chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        **extra,
    }


@dataclass
class StreamResult:
    status: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    done: bool = False
    retry_after: str | None = None
    error: Any = None


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    started: asyncio.Event | None = None,
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """One streamed chat request, read to its end (or its error)."""
    out = StreamResult()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        out.status = r.status_code
        out.retry_after = r.headers.get("retry-after")
        if r.status_code != 200:
            await r.aread()
            out.error = r.json()
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                out.done = True
                continue
            chunk = json.loads(payload)
            if "error" in chunk:
                out.error = chunk["error"]
            for choice in chunk.get("choices", []):
                if choice.get("delta", {}).get("content") and started is not None:
                    started.set()
                if choice.get("finish_reason"):
                    out.finish_reasons.append(choice["finish_reason"])
    return out
