"""Token events per request, merged up to `--stream-interval` tokens before they are sent.

The engine thread produces one event per request per step. With an interval of N, a request's
first token goes out at once (TTFT is unchanged), later tokens are held until N have gathered, and
a finish (or an error) flushes whatever is held. Fewer, larger events mean fewer wake-ups and
chunks for the event loop, which shares the GIL with the engine thread: the same trade as
TensorRT-LLM's `stream_interval` and SGLang's `--stream-interval`.
"""

from __future__ import annotations

from trtllm_gateway.engine.protocol import TokenEvent

EventOrError = TokenEvent | BaseException  # a request's next item: an event, or its failure


def merge_events(a: TokenEvent, b: TokenEvent) -> TokenEvent:
    """b's tokens appended to a's; finish, usage and timings are b's, prompt logprobs a's."""
    return merge_all([a, b])


def merge_all(events: list[TokenEvent]) -> TokenEvent:
    """One event with the tokens of all; the last one's finish, usage and timings."""
    if len(events) == 1:
        return events[0]
    last = events[-1]
    lps = [lp for e in events if e.logprobs is not None for lp in e.logprobs]
    return TokenEvent(
        tuple(t for e in events for t in e.token_ids),
        tuple(lps) if any(e.logprobs is not None for e in events) else None,
        finish_reason=last.finish_reason,
        stop_token_id=last.stop_token_id,
        usage=last.usage,
        timings=last.timings,
        prompt_logprobs=next((e.prompt_logprobs for e in events if e.prompt_logprobs), None),
    )


class StreamInterval:
    """Holds each request's tokens until `interval` have gathered (engine thread only)."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        # Held events per request, merged once when they go out (not once per step).
        self._held: dict[str, list[TokenEvent]] = {}
        self._started: set[str] = set()  # requests whose first token has gone out

    def __call__(self, events: list[tuple[str, EventOrError]]) -> list[tuple[str, EventOrError]]:
        """The events to send now, in order; the rest are held for a later step."""
        if self.interval <= 1:
            return events
        out: list[tuple[str, EventOrError]] = []
        for request_id, event in events:
            if isinstance(event, BaseException):
                self._forget(request_id)
                out.append((request_id, event))
                continue
            held = self._held.pop(request_id, [])
            held.append(event)
            waiting = event.finish_reason is None and request_id in self._started
            if waiting and sum(len(e.token_ids) for e in held) < self.interval:
                self._held[request_id] = held
                continue
            event = merge_all(held)
            if event.finish_reason is not None:
                self._started.discard(request_id)
            elif event.token_ids:
                self._started.add(request_id)
            out.append((request_id, event))
        return out

    def _forget(self, request_id: str) -> None:
        self._held.pop(request_id, None)
        self._started.discard(request_id)

    @property
    def holding(self) -> int:
        """Requests with tokens held back (0 once every request has finished)."""
        return len(self._held)
