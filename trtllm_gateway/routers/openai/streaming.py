"""The render step's response: a run's merged deltas leave as SSE frames (after a first-event
peek, so errors before the first token are real HTTP statuses) or, collected, as one JSON body;
the endpoint's Renderer shapes both."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi.responses import JSONResponse, Response

from trtllm_gateway.routers.openai.fanout import Item
from trtllm_gateway.routers.openai.renderer import Renderer
from trtllm_gateway.routers.openai.run import Run
from trtllm_gateway.web.errors import error_payload
from trtllm_gateway.web.sse import DONE, EventStreamResponse, error_frame, frame

logger = logging.getLogger(__name__)


async def respond(run: Run, items: AsyncGenerator[Item, None], renderer: Renderer) -> Response:
    """The run's deltas rendered: SSE (stream=true) or one JSON body."""
    headers = {"X-Request-Id": run.request_id}
    if not run.body.stream:
        response = renderer.response(await collect(items))
        return JSONResponse(response.model_dump(mode="json"), headers=headers)
    prelude = [frame(c) for c in renderer.prelude()]  # before the peek: zero tokens so far
    keepalive_s = run.serving.config.sse_keepalive_interval
    first = await peek_stream(items, keepalive_s)
    return EventStreamResponse(
        stream_frames(run.request_id, first, items, prelude, renderer),
        headers=headers,
        on_disconnect=run.serving.metrics.client_disconnected,
        keepalive_s=keepalive_s,
        write_timeout_s=run.serving.config.sse_write_timeout,
    )


async def peek(items: AsyncGenerator[Item, None]) -> Item | None:
    """The first item, so that errors before the first token become real HTTP statuses."""
    try:
        return await anext(items)
    except StopAsyncIteration:
        return None


@dataclass(frozen=True, slots=True)
class Pending:
    """A first item still on its way when the stream starts (queued, or in remote prefill)."""

    task: asyncio.Future[Item | None]


First = Item | None | Pending


async def peek_stream(items: AsyncGenerator[Item, None], wait_s: float) -> First:
    """peek, but give up after wait_s (> 0): the stream then starts and keep-alive comments flow
    while the request waits; an error that comes later is an error frame, not a status."""
    if wait_s <= 0:
        return await peek(items)
    task = asyncio.ensure_future(peek(items))
    try:
        done, _ = await asyncio.wait({task}, timeout=wait_s)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    return task.result() if task in done else Pending(task)


async def settle(first: First) -> Item | None:
    if not isinstance(first, Pending):
        return first
    return await asyncio.shield(first.task)  # cancelled and awaited by finish_pending


@contextlib.asynccontextmanager
async def finish_pending(first: First) -> AsyncIterator[None]:
    """On the way out, cancel and await a pending peek, so the generator that task runs is no
    longer running when aclosing closes it (and its error, if any, is retrieved)."""
    try:
        yield
    finally:
        if isinstance(first, Pending):
            first.task.cancel()
            await asyncio.gather(first.task, return_exceptions=True)


async def collect(items: AsyncGenerator[Item, None]) -> list[Item]:
    async with aclosing(items) as all_items:
        return [item async for item in all_items]


async def stream_frames(
    request_id: str,
    first: First,
    items: AsyncGenerator[Item, None],
    prelude: list[bytes],
    renderer: Renderer,
) -> AsyncGenerator[bytes, None]:
    """SSE frames: prelude, rendered items, epilogue, [DONE]; a failure after the first byte is
    one error frame, then [DONE]."""
    async with aclosing(items) as rest, finish_pending(first):
        for prelude_frame in prelude:
            yield prelude_frame
        try:
            item = await settle(first)
            while item is not None:
                for rendered in renderer.chunks(*item):
                    yield frame(rendered)
                item = await anext(rest, None)
        except Exception as exc:
            logger.warning("request %s failed mid-stream: %r", request_id, exc)
            yield error_frame(error_payload(exc)["error"])
            yield DONE
            return
        for chunk in renderer.epilogue():
            yield frame(chunk)
        yield DONE
