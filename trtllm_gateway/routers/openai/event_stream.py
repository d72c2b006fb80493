"""Named-event SSE (`event: NAME\ndata: {json}\n\n`) for the agent APIs: Responses' and Messages'
streams have no `[DONE]`; a failure after the first byte is the API's own last event.

    respond_events(run, items, renderer)
        stream=false: renderer.response(every item)          -> one JSON body
        stream=true:  prelude (before the first-event peek)  -> frames
                      events(item) for each item             -> frames
                      epilogue() | failed(exc)               -> frames, then the stream ends

The peek and the keep-alives are chat's (streaming.peek_stream); admission, metrics and
cancellation are the run's, as for chat.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from trtllm_gateway.routers.openai.choice_output import ChoiceDelta
from trtllm_gateway.routers.openai.fanout import Item
from trtllm_gateway.routers.openai.run import Run
from trtllm_gateway.routers.openai.streaming import (
    First,
    collect,
    finish_pending,
    peek_stream,
    settle,
)
from trtllm_gateway.web.sse import EventStreamResponse

logger = logging.getLogger(__name__)

Event = tuple[str, Mapping[str, Any]]  # (the SSE event name, its data)


class EventRenderer(Protocol):
    """Called by respond_events only, on the request's task; one choice (index 0)."""

    def prelude(self) -> Iterable[Event]:
        """Events sent before any engine output (response.created, message_start)."""
        ...

    def events(self, delta: ChoiceDelta) -> Iterable[Event]:
        """The events of one delta."""
        ...

    def epilogue(self) -> Iterable[Event]:
        """The events after the last delta (the .done events, the final response)."""
        ...

    def failed(self, exc: BaseException) -> Iterable[Event]:
        """The last events of a stream that failed after its first byte."""
        ...

    def response(self, items: Sequence[Item]) -> BaseModel:
        """The stream=false body, from every delta in the order they came."""
        ...


def event_frame(name: str, data: Mapping[str, Any]) -> bytes:
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return b"event: " + name.encode() + b"\ndata: " + body.encode() + b"\n\n"


async def respond_events(
    run: Run,
    items: AsyncGenerator[Item, None],
    renderer: EventRenderer,
    stream: bool,
    on_done: Callable[[], Awaitable[None]] | None = None,
) -> Response:
    """The run's deltas as named SSE events (stream) or one JSON body. `on_done()`: awaited once
    the response is whole, before its last events or its body leave (the response store)."""
    headers = {"X-Request-Id": run.request_id}
    if not stream:
        body = renderer.response(await collect(items))
        if on_done is not None:
            await on_done()
        return JSONResponse(body.model_dump(mode="json"), headers=headers)
    prelude = [event_frame(*e) for e in renderer.prelude()]
    keepalive_s = run.serving.config.sse_keepalive_interval
    first = await peek_stream(items, keepalive_s)
    return EventStreamResponse(
        _frames(run.request_id, first, items, prelude, renderer, on_done),
        headers=headers,
        on_disconnect=run.serving.metrics.client_disconnected,
        keepalive_s=keepalive_s,
    )


async def _frames(
    request_id: str,
    first: First,
    items: AsyncGenerator[Item, None],
    prelude: list[bytes],
    renderer: EventRenderer,
    on_done: Callable[[], Awaitable[None]] | None,
) -> AsyncGenerator[bytes, None]:
    async with aclosing(items) as rest, finish_pending(first):
        for prelude_frame in prelude:
            yield prelude_frame
        try:
            item = await settle(first)
            while item is not None:
                for event in renderer.events(item[1]):
                    yield event_frame(*event)
                item = await anext(rest, None)
            closing = list(renderer.epilogue())
            if on_done is not None:
                await on_done()
        except Exception as exc:
            logger.warning("request %s failed mid-stream: %r", request_id, exc)
            closing = list(renderer.failed(exc))
        for event in closing:
            yield event_frame(*event)
