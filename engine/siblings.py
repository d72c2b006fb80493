"""SiblingPool: the sibling instances a gateway offloads work to (remote prefill, remote encode).

Picks the sibling with the fewest outstanding requests (round robin on ties), skips a failed one
for a backoff period, and forwards the caller's Authorization header.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from engine.protocol import CALLER_AUTHORIZATION


@dataclass
class Sibling:
    url: str
    outstanding: int = 0
    healthy: bool = True
    retry_at: float = 0.0  # while unhealthy: skipped until then
    checked: bool = False  # compatibility compared once (remote prefill)


class SiblingPool:
    def __init__(self, urls: Sequence[str], backoff: float) -> None:
        self.siblings = [Sibling(u.rstrip("/")) for u in urls]
        self.backoff = backoff
        self._turn = 0

    def pick(self) -> Sibling | None:
        """The least busy usable sibling, or None when every one is backing off."""
        now = time.monotonic()
        usable = [s for s in self.siblings if s.healthy or s.retry_at <= now]
        if not usable:
            return None
        least = min(s.outstanding for s in usable)
        tied = [s for s in usable if s.outstanding == least]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def mark(self, sib: Sibling, healthy: bool) -> None:
        sib.healthy = healthy
        if not healthy:
            sib.retry_at = time.monotonic() + self.backoff

    @contextlib.contextmanager
    def busy(self, sib: Sibling) -> Iterator[Sibling]:
        sib.outstanding += 1
        try:
            yield sib
        finally:
            sib.outstanding -= 1


def caller_headers() -> dict[str, str]:
    """The caller's Authorization header, to forward to a sibling."""
    auth = CALLER_AUTHORIZATION.get()
    return {"Authorization": auth} if auth else {}
