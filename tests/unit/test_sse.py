"""web/sse.py: framing, and EventStreamResponse closing its generator when the client leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from trtllm_gateway.routers.openai.schemas import DeltaMessage, UsageInfo
from trtllm_gateway.web.sse import DONE, EventStreamResponse, error_frame, frame


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


async def _run_stalled(response: EventStreamResponse, bodies_taken: int) -> list[bytes]:
    """Run the response against a client whose socket fills after `bodies_taken` body messages:
    uvicorn's send() then waits for a drain that never comes (its flow control, h11_impl.send)."""
    taken: list[bytes] = []
    closed: list[int] = []
    response.on_close(lambda: closed.append(1))

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # connected, never reading
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            if len(taken) >= bodies_taken:
                await asyncio.Event().wait()
            taken.append(message["body"])

    await response({"type": "http"}, receive, send)
    assert closed == [1]  # the admission slot goes back
    return taken


async def test_a_client_that_stops_reading_ends_its_stream() -> None:
    """Issue 40, item 3: the stream ends within the write timeout and its frames (the engine
    request) are closed, though the client never disconnects."""
    closed = asyncio.Event()
    disconnects: list[int] = []

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            for i in range(1000):
                yield f"data: {i}\n\n".encode()
        finally:
            closed.set()

    response = EventStreamResponse(
        frames(), on_disconnect=lambda: disconnects.append(1), write_timeout_s=0.2
    )
    async with asyncio.timeout(5):
        taken = await _run_stalled(response, bodies_taken=3)
    assert taken == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert closed.is_set()
    assert disconnects == [1]


async def test_a_stalled_keepalive_ends_a_quiet_stream() -> None:
    """The engine quiet (queued): the stalled keep-alive comment ends the stream as well."""
    closed = asyncio.Event()

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(30)
            yield b"data: 2\n\n"
        finally:
            closed.set()

    response = EventStreamResponse(frames(), keepalive_s=0.05, write_timeout_s=0.2)
    async with asyncio.timeout(5):
        taken = await _run_stalled(response, bodies_taken=1)
    assert taken == [b"data: 1\n\n"]
    assert closed.is_set()


async def test_a_slow_reader_is_not_cut_off() -> None:
    """Each send may wait up to the timeout: a client that reads slowly but steadily keeps its
    stream."""

    async def frames() -> AsyncGenerator[bytes, None]:
        for i in range(5):
            yield f"data: {i}\n\n".encode()

    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0.1)  # drains, slowly
        sent.append(message.get("body"))

    await EventStreamResponse(frames(), write_timeout_s=0.3)({"type": "http"}, receive, send)
    assert sent[-2:] == [b"data: 4\n\n", b""]
