"""Token events per request, merged up to `--stream-interval` tokens before they are sent.

The engine thread produces one event per request per step. With an interval of N, a request's
first token goes out at once (TTFT is unchanged), later tokens are held until N have gathered, and
a finish (or an error) flushes whatever is held. Fewer, larger events mean fewer wake-ups and
chunks for the event loop, which shares the GIL with the engine thread: the same trade as
TensorRT-LLM's `stream_interval` and SGLang's `--stream-interval`.
"""

from __future__ import annotations

from engine.protocol import TokenEvent

Event = TokenEvent | BaseException


def merge_events(a: TokenEvent, b: TokenEvent) -> TokenEvent:
    """b's tokens appended to a's; finish, usage and timings are b's, prompt logprobs a's."""
    logprobs = (
        None
        if a.logprobs is None and b.logprobs is None
        else ((a.logprobs or ()) + (b.logprobs or ()))
    )
    return TokenEvent(
        a.token_ids + b.token_ids,
        logprobs,
        finish_reason=b.finish_reason,
        stop_token_id=b.stop_token_id,
        usage=b.usage,
        timings=b.timings,
        prompt_logprobs=a.prompt_logprobs or b.prompt_logprobs,
    )


class StreamInterval:
    """Holds each request's tokens until `interval` have gathered (engine thread only)."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        # Held events per request and their token count; merged once, when they go out.
        self._held: dict[str, tuple[list[TokenEvent], int]] = {}
        self._started: set[str] = set()  # requests whose first token has gone out

    def __call__(self, events: list[tuple[str, Event]]) -> list[tuple[str, Event]]:
        """The events to send now, in order; the rest are held for a later step."""
        if self.interval <= 1:
            return events
        out: list[tuple[str, Event]] = []
        for request_id, event in events:
            if isinstance(event, BaseException):
                self._forget(request_id)
                out.append((request_id, event))
                continue
            held, count = self._held.pop(request_id, ((), 0))
            count += len(event.token_ids)
            if event.finish_reason is not None:
                self._forget(request_id)
            elif request_id in self._started and count < self.interval:
                self._held[request_id] = ([*held, event], count)
                continue
            elif count:
                self._started.add(request_id)
            for earlier in reversed(held):
                event = merge_events(earlier, event)
            out.append((request_id, event))
        return out

    def _forget(self, request_id: str) -> None:
        self._held.pop(request_id, None)
        self._started.discard(request_id)

    @property
    def holding(self) -> int:
        """Requests with tokens held back (0 once every request has finished)."""
        return len(self._held)
