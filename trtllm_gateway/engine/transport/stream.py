"""A request's stream on the client side: its event queue drained, a prefill's end.

CoreClient fills one asyncio.Queue per request from the core's OutputBatches; the generator here
owns the request (closed early, it aborts it), merges what a slow consumer let pile up, and a
context phase's events become the PrefillResult a sibling pulls the KV with.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

from trtllm_gateway.engine.protocol import EngineError, OverloadedError, PrefillResult, TokenEvent
from trtllm_gateway.engine.transport.stream_interval import merge_events

E = TypeVar("E", bound=BaseException)


async def drain(q: asyncio.Queue[TokenEvent | E]) -> AsyncIterator[TokenEvent]:
    """A request's events until its last; an error queued for it is raised.

    A consumer that fell behind gets the tokens queued meanwhile as one event, so a slow client
    costs one chunk per wake-up, not one per token.
    """
    held: TokenEvent | E | None = None
    while True:
        item = held if held is not None else await q.get()
        held = None
        if isinstance(item, BaseException):
            raise item
        while item.finish_reason is None and not q.empty():
            nxt = q.get_nowait()
            if isinstance(nxt, BaseException):
                held = nxt
                break
            item = merge_events(item, nxt)
        yield item
        if item.finish_reason is not None:
            return


async def follow(
    queues: dict[str, asyncio.Queue[TokenEvent | E]],
    request_id: str,
    abort: Callable[[str], None],
) -> AsyncGenerator[TokenEvent]:
    """The events of a request whose queue is in queues, until its last or an error.

    The generator owns the request: closed before the last event (a client gone), it aborts it;
    either way its queue leaves queues.
    """
    finished = False
    try:
        async for item in drain(queues[request_id]):
            finished = item.finish_reason is not None
            yield item
    except EngineError:
        finished = True
        raise
    finally:
        queues.pop(request_id, None)
        if not finished:
            abort(request_id)


def prefill_result(request_id: str, events: list[TokenEvent], kv_layout: str) -> PrefillResult:
    """A finished context phase: its first token(s), and what a sibling needs to pull its KV."""
    last = events[-1]
    if last.finish_reason == "abort":
        raise OverloadedError("the context phase was aborted")
    assert last.usage is not None
    return PrefillResult(
        request_id=request_id,
        first_token_ids=tuple(t for ev in events for t in ev.token_ids),
        first_logprobs=tuple(lp for ev in events for lp in ev.logprobs or ()) or None,
        prompt_tokens=last.usage.prompt_tokens,
        cached_tokens=last.usage.cached_tokens,
        opaque_state=json.dumps({"ctx_request_id": request_id, "kv_layout": kv_layout}).encode(),
    )
