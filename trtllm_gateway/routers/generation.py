"""The one generation path chat and completions share: admission, checks, sampling params,
fan-out over n, per-choice render, merge by index, the first-event peek and the SSE frame loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, cast

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from trtllm_gateway.app import request_context
from trtllm_gateway.app.cancel import cancel_on_disconnect
from trtllm_gateway.app.deps import Serving
from trtllm_gateway.app.errors import BadRequestError, ModelNotFoundError, error_payload
from trtllm_gateway.app.metrics import RequestRecorder
from trtllm_gateway.app.sse import DONE, EventStreamResponse, error_frame, frame
from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    Engine,
    GenerateRequest,
    GuidedDecoding,
    SamplingParams,
    TokenEvent,
)
from trtllm_gateway.routers import validation
from trtllm_gateway.routers.render import ChoiceDelta, ChoiceRenderer
from trtllm_gateway.routers.schemas import SamplingFields

logger = logging.getLogger(__name__)

MAX_LOGPROBS = 20
Item = tuple[int, ChoiceDelta]


def engine_request_ids(request_id: str, count: int) -> list[str]:
    """The engine ids of one HTTP request's choices: `{request_id}-{i}`. A client's X-Request-Id
    may be sent by several requests at once (retries, one id per session), so it also gets a short
    random tag; the engine keys requests by id and would refuse the second."""
    ctx = request_context.current()
    if ctx is not None and ctx.client_supplied:
        request_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
    return [f"{request_id}-{i}" for i in range(count)]


def new_request_id(request: Request, prefix: str) -> str:
    """A valid client X-Request-Id (vLLM does the same), else `{prefix}-{hex}`; either way the
    id the response echoes and every log line of the request carries."""
    del request  # the request context (app/request_context.py) has read the header
    return request_context.new_request_id(prefix)


async def admitted(
    request: Request,
    serving: Serving,
    weight: int,
    handler: Callable[[], Coroutine[Any, Any, Response]],
) -> Response:
    """Reserve `weight` engine requests before any work (503 + Retry-After when full), run the
    handler under the disconnect watcher, and release the slot when the response has ended."""
    slot = serving.admission.reserve(weight)
    try:
        response = await cancel_on_disconnect(request.receive, handler())
    except BaseException:
        slot.release()
        raise
    if isinstance(response, EventStreamResponse):
        response.on_close(slot.release)
    else:
        slot.release()
    return response


def check_common(body: SamplingFields, serving: Serving) -> None:
    """Checks shared by chat and completions that need no tokenizer."""
    if serving.settings.mode in ("prefill", "encode"):
        raise BadRequestError(
            f"this instance runs in --mode {serving.settings.mode} and only serves sibling "
            "instances; send generation requests to a decode or aggregated instance",
            code="wrong_mode",
        )
    if body.model is not None and body.model != serving.model_name:
        raise ModelNotFoundError(f"The model `{body.model}` does not exist.", param="model")
    if body.best_of is not None and body.best_of > 1:
        raise BadRequestError("best_of > 1 is not supported.", param="best_of")
    validation.check_values(body)
    vocab = validation.vocab_bound(serving.info.vocab_size, serving.tokenizer.vocab_size)
    validation.check_sampling_ids(body, vocab)
    if body.model_extra:
        logger.debug("ignoring unknown request fields: %s", sorted(body.model_extra))


def check_logprobs(k: int | None, param: str, limit: int = MAX_LOGPROBS) -> None:
    if k is not None and k > limit:
        raise BadRequestError(f"{param} must be at most {limit}.", param=param)


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int) -> int:
    """The request's max_tokens, or the context that remains; too long is a 400 with both counts."""
    if prompt_tokens == 0:
        raise BadRequestError("The prompt is empty.", param="prompt")
    if prompt_tokens + max(requested or 0, 1) > max_model_len:
        raise ContextTooLongError(prompt_tokens, requested or 0, max_model_len)
    return requested if requested is not None else max_model_len - prompt_tokens


def sampling_params(
    body: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    seed_offset: int = 0,
    guided: GuidedDecoding | None = None,
) -> SamplingParams:
    top_k = body.top_k or 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if top_k < 0 else top_k,
        min_p=body.min_p or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        seed=None if body.seed is None else body.seed + seed_offset,
        min_tokens=min(body.min_tokens, max_tokens),
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        logit_bias=validation.logit_bias_pairs(body.logit_bias),
        allowed_token_ids=None if body.allowed_token_ids is None else tuple(body.allowed_token_ids),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        guided=guided,
    )


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    request: GenerateRequest
    renderer: ChoiceRenderer


async def choice_stream(
    engine: Engine, choice: Choice, recorder: RequestRecorder
) -> AsyncGenerator[ChoiceDelta, None]:
    """One engine request rendered; stops iterating (closing, so aborting, the engine request)
    as soon as the renderer finishes, e.g. on a stop string."""
    renderer = choice.renderer
    events = cast(AsyncGenerator[TokenEvent, None], engine.generate(choice.request))
    try:
        async with aclosing(events) as engine_events:
            async for event in engine_events:
                recorder.on_event(event)  # inline rather than a wrapper: one generator hop less
                yield renderer.feed(event)
                if renderer.finished and event.finish_reason is None:
                    break  # a stop string: closing the engine generator aborts the request
    finally:
        recorder.finish(renderer.finish_reason)


async def merge(streams: list[AsyncGenerator[ChoiceDelta, None]]) -> AsyncGenerator[Item, None]:
    """Interleave the choices' deltas as they come, tagged with the choice index."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for delta in only:
                yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, ChoiceDelta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[ChoiceDelta, None]) -> None:
        try:
            async with aclosing(stream) as deltas:
                async for delta in deltas:
                    queue.put_nowait((index, delta))
            queue.put_nowait((index, None))
        except Exception as exc:
            queue.put_nowait((index, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def start(serving: Serving, choices: list[Choice], arrival: float) -> AsyncGenerator[Item, None]:
    streams = [choice_stream(serving.engine, c, serving.metrics.recorder(arrival)) for c in choices]
    return merge(streams)


def prompt_count(prompt: object) -> int:
    """Prompts in a completions `prompt` (text, token ids, or a batch of either), unparsed."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


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


async def _settle(first: First) -> Item | None:
    if not isinstance(first, Pending):
        return first
    return await asyncio.shield(first.task)  # cancelled and awaited by _finish_pending


@contextlib.asynccontextmanager
async def _finish_pending(first: First) -> AsyncIterator[None]:
    """On the way out, cancel and await a pending peek, so the generator that task runs is no
    longer running when aclosing closes it (and its error, if any, is retrieved)."""
    try:
        yield
    finally:
        if isinstance(first, Pending):
            first.task.cancel()
            await asyncio.gather(first.task, return_exceptions=True)


async def collect(first: Item | None, items: AsyncGenerator[Item, None]) -> list[Item]:
    out = [] if first is None else [first]
    async with aclosing(items) as rest:
        out.extend([item async for item in rest])
    return out


async def stream_frames(
    request_id: str,
    first: First,
    items: AsyncGenerator[Item, None],
    prelude: Iterable[BaseModel],
    render: Callable[[int, ChoiceDelta], Iterable[BaseModel | bytes]],
    epilogue: Callable[[], Iterable[BaseModel]],
) -> AsyncGenerator[bytes, None]:
    """SSE frames: prelude, rendered items, epilogue, [DONE]; a failure after the first byte is
    one error frame, then [DONE]."""
    async with aclosing(items) as rest, _finish_pending(first):
        for chunk in prelude:
            yield frame(chunk)
        try:
            item = await _settle(first)
            while item is not None:
                for rendered in render(*item):
                    yield frame(rendered)
                item = await anext(rest, None)
        except Exception as exc:
            logger.warning("request %s failed mid-stream: %r", request_id, exc)
            yield error_frame(error_payload(exc)["error"])
            yield DONE
            return
        for chunk in epilogue():
            yield frame(chunk)
        yield DONE


# Prelude chunks, the chunks of one delta (a model, or JSON bytes from a TextChunk), epilogue.
Renderers = tuple[
    Iterable[BaseModel],
    Callable[[int, ChoiceDelta], Iterable[BaseModel | bytes]],
    Callable[[], Iterable[BaseModel]],
]


async def stream_response(
    serving: Serving,
    request_id: str,
    items: AsyncGenerator[Item, None],
    renderers: Renderers,
    headers: dict[str, str],
) -> EventStreamResponse:
    """Peek (up to the keep-alive interval), then the SSE response over the frames."""
    keepalive_s = serving.settings.sse_keepalive_interval
    first = await peek_stream(items, keepalive_s)
    frames = stream_frames(request_id, first, items, *renderers)
    return EventStreamResponse(
        frames,
        headers=headers,
        on_disconnect=serving.metrics.client_disconnected,
        keepalive_s=keepalive_s,
    )
