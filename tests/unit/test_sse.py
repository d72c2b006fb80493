"""app/sse.py: framing, and EventStreamResponse closing its generator when the client leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from trtllm_gateway.app.sse import DONE, EventStreamResponse, error_frame, frame
from trtllm_gateway.openai.schemas import DeltaMessage, UsageInfo


def test_frame_dict_and_model() -> None:
    assert frame({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    body = frame(UsageInfo(prompt_tokens=1, completion_tokens=2, total_tokens=3))
    assert body.startswith(b"data: ")
    assert body.endswith(b"\n\n")
    assert json.loads(body[6:])["total_tokens"] == 3


def test_delta_drops_nulls() -> None:
    assert json.loads(frame(DeltaMessage(content="hi"))[6:]) == {"content": "hi"}
    assert json.loads(frame(DeltaMessage(role="assistant", content=""))[6:]) == {
        "role": "assistant",
        "content": "",
    }


def test_done_and_error_frame() -> None:
    assert DONE == b"data: [DONE]\n\n"
    err = {"message": "m", "type": "t", "param": None, "code": None}
    assert json.loads(error_frame(err)[6:]) == {"error": err}


async def _run(response: EventStreamResponse, disconnect_after_s: float) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(disconnect_after_s)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await response({"type": "http"}, receive, send)
    return sent


async def test_stream_completes() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"data: 1\n\n"
        yield DONE

    sent = await _run(EventStreamResponse(frames()), disconnect_after_s=10)
    assert sent[0]["status"] == 200
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"cache-control"] == b"no-cache"
    assert headers[b"x-accel-buffering"] == b"no"
    assert b"content-length" not in headers
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", DONE, b""]


async def test_disconnect_while_quiet_closes_generator() -> None:
    closed = asyncio.Event()
    disconnects: list[int] = []

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(30)  # the engine is quiet; no write would notice the client
            yield b"data: 2\n\n"
        finally:
            closed.set()

    response = EventStreamResponse(frames(), on_disconnect=lambda: disconnects.append(1))
    async with asyncio.timeout(5):
        sent = await _run(response, disconnect_after_s=0.05)
    assert closed.is_set()
    assert disconnects == [1]
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]
