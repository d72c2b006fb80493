"""PrefillQueue: a prefill instance's context phases in flight, bounded in prompt tokens.

A decode sibling sends its long prompts here; past --max-queued-prefill-tokens a new one is
refused at once with 503 and the queue (requests, tokens) in the sibling protocol's headers
(engine/disagg/sibling_wire.py), so the decode side decides by policy (retry, another sibling,
local prefill) instead of waiting until its deadline and taking the sibling for dead: in
issue 41's run, 24 of 48 long prompts were prefilled locally after such a timeout.

An idle instance admits any prompt, so one longer than the bound is served alone.
"""

from __future__ import annotations

from trtllm_gateway.engine.disagg.sibling_wire import QueueReport
from trtllm_gateway.web.errors import ServiceUnavailableError


class PrefillTicket:
    """One admitted context phase; `release()` is idempotent."""

    __slots__ = ("_queue", "_released", "tokens")

    def __init__(self, queue: PrefillQueue, tokens: int) -> None:
        self._queue = queue
        self.tokens = tokens
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._queue.requests -= 1
            self._queue.tokens -= self.tokens


class PrefillQueue:
    """Event-loop only: enter/release never await."""

    def __init__(self, max_tokens: int | None) -> None:
        self.max_tokens = max_tokens  # None: no bound
        self.requests = 0
        self.tokens = 0
        self.refused = 0

    def report(self) -> QueueReport:
        return QueueReport(self.requests, self.tokens)

    def busy(self, message: str, code: str | None = None) -> ServiceUnavailableError:
        """A 503 that carries the queue (the decode side's policy reads it)."""
        return ServiceUnavailableError(
            message, code=code or "prefill_queue_full", headers=self.report().headers()
        )

    def enter(self, tokens: int) -> PrefillTicket:
        """A ticket for a context phase of `tokens` prompt tokens, or the busy 503."""
        bound = self.max_tokens
        if bound is not None and self.requests > 0 and self.tokens + tokens > bound:
            self.refused += 1
            raise self.busy(
                f"prefill queue full: {self.requests} context phases of {self.tokens} prompt "
                f"tokens queued, limit {bound} tokens (--max-queued-prefill-tokens)"
            )
        self.requests += 1
        self.tokens += tokens
        return PrefillTicket(self, tokens)
