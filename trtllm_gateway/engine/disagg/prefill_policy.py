"""BusyPolicy: what a decode instance does when every prefill sibling it asked answered busy.

A busy sibling (503, its queue in the answer) is not a failed one: it is never marked unhealthy.
The decode side first asks the other siblings; when all of them are busy it either waits and
asks again, or prefills the prompt here:

    local   when the least-queued sibling has more than local_factor x the prompt's uncached
            tokens queued ahead of it (waiting behind that much work costs more than computing
            the prompt here, which stalls this instance's decodes for about its own length),
            or after `retries` waits
    retry   otherwise, after 0.1, 0.2, 0.4 ... s (never longer than the sibling's Retry-After
            nor 1 s), every sibling eligible again

The decision is a pure function of what the siblings said, so it is tested alone
(tests/unit/test_prefill_policy.py); engine/disagg/remote_prefill.py applies it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trtllm_gateway.engine.disagg.sibling_wire import QueueReport


@dataclass(frozen=True, slots=True)
class BusyPolicy:
    local_factor: float  # --busy-local-factor
    retries: int  # --remote-prefill-retries
    first_wait_s: float = 0.1
    max_wait_s: float = 1.0

    def wait_before_retry(
        self,
        uncached: int,
        queues: Iterable[QueueReport],
        retry: int,
        retry_after: float | None = None,
    ) -> float | None:
        """Seconds to wait before retry number `retry` (from 1) once every sibling asked was
        busy with `queues`; None: prefill locally instead."""
        if retry > self.retries:
            return None
        least = least_queued(queues)
        if least is not None and least > self.local_factor * uncached:
            return None
        wait: float = self.first_wait_s * 2.0 ** (retry - 1)
        cap = self.max_wait_s if retry_after is None else min(self.max_wait_s, retry_after)
        return min(wait, cap)


def least_queued(queues: Iterable[QueueReport]) -> int | None:
    """The fewest tokens any busy sibling has queued (None when none of them said)."""
    known = [q.tokens for q in queues if q.tokens is not None]
    return min(known, default=None)
