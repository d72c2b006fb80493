"""The fan-out of one HTTP request over its choices: one engine request each, turned into
ChoiceDeltas by its ChoiceOutput, merged as they come and tagged with the choice index."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, aclosing, nullcontext
from dataclasses import dataclass
from typing import cast

from trtllm_gateway.engine.protocol import Engine, GenerateRequest, TokenEvent
from trtllm_gateway.routers.openai.choice_output import ChoiceDelta, ChoiceOutput
from trtllm_gateway.web.metrics import RequestRecorder

Item = tuple[int, ChoiceDelta]


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    request: GenerateRequest
    output: ChoiceOutput


async def choice_stream(
    engine: Engine,
    choice: Choice,
    recorder: RequestRecorder,
    place: AbstractAsyncContextManager[object] | None = None,
) -> AsyncGenerator[ChoiceDelta, None]:
    """One engine request's deltas; stops iterating (closing, so aborting, the engine request)
    as soon as the output finishes, e.g. on a stop string. `place`: held while the engine
    request runs (a semaphore bounds how many of one HTTP request's choices run at once); the
    engine request starts once it is taken, and a wait cut short ends like an abort."""
    output = choice.output
    try:
        async with (
            place or nullcontext(),
            aclosing(
                cast(AsyncGenerator[TokenEvent, None], engine.generate(choice.request))
            ) as engine_events,
        ):
            async for event in engine_events:
                recorder.on_event(event)  # inline rather than a wrapper: one generator hop less
                yield output.feed(event)
                if output.finished and event.finish_reason is None:
                    break  # a stop string: closing the engine generator aborts the request
    finally:
        # The engine's count when its final event came (it expands image placeholders), else
        # the ids sent: a stop string, a disconnect or an abort ends the request before it.
        usage = output.usage
        prompt = usage.prompt_tokens if usage is not None else len(choice.request.prompt_token_ids)
        recorder.finish(output.finish_reason, prompt)


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
