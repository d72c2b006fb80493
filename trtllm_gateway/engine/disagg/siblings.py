"""SiblingPool: the sibling instances a gateway offloads work to (remote prefill, remote encode).

Picks the sibling with the fewest outstanding requests (round robin on ties), skips a failed one
for a backoff period, and presents the internal key (--internal-api-key). Given a prompt and the
siblings' prefix indexes (KV-aware routing, docs/kv_events.md), it picks the lowest cost instead:

    cost(s) = (prompt tokens - tokens s has cached) + load_weight * tokens queued at s

where "queued" counts the uncached prompt tokens of this instance's requests in flight at s. When
no sibling holds any of the prompt, the choice is the least-outstanding one as before.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from trtllm_gateway.engine.disagg.prefix_index import PrefixIndex
from trtllm_gateway.engine.stats import KvRoutingStats


@dataclass
class Sibling:
    url: str
    outstanding: int = 0
    healthy: bool = True
    retry_at: float = 0.0  # while unhealthy: skipped until then
    checked: bool = False  # compatibility compared once (remote prefill)
    kv: PrefixIndex = field(default_factory=PrefixIndex)  # filled by a KvFollower, if any
    queued_tokens: int = 0  # uncached prompt tokens of our requests in flight there


class SiblingPool:
    def __init__(self, urls: Sequence[str], backoff: float, load_weight: float = 1.0) -> None:
        self.siblings = [Sibling(u.rstrip("/")) for u in urls]
        self.backoff = backoff
        self.load_weight = load_weight
        self.kv_stats = KvRoutingStats()
        self._turn = 0

    def usable(self, among: Sequence[Sibling] | None = None) -> list[Sibling]:
        now = time.monotonic()
        pool = self.siblings if among is None else among
        return [s for s in pool if s.healthy or s.retry_at <= now]

    def pick(self, among: Sequence[Sibling] | None = None) -> Sibling | None:
        """The least busy usable sibling, or None when every one is backing off."""
        usable = self.usable(among)
        if not usable:
            return None
        least = min(s.outstanding for s in usable)
        tied = [s for s in usable if s.outstanding == least]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def pick_for(
        self, prompt_token_ids: Sequence[int], among: Sequence[Sibling] | None = None
    ) -> tuple[Sibling | None, int]:
        """The cheapest usable sibling for this prompt and the tokens it has cached."""
        usable = self.usable(among)
        cached = {s.url: s.kv.cached_tokens(prompt_token_ids) for s in usable}
        if not usable or max(cached.values()) == 0:
            sib = self.pick(usable)
            self._count(sib, "load", 0)
            return sib, 0
        n = len(prompt_token_ids)
        best = min(
            usable,
            key=lambda s: (n - cached[s.url] + self.load_weight * s.queued_tokens, s.outstanding),
        )
        self._count(best, "prefix", cached[best.url])
        return best, cached[best.url]

    def _count(self, sib: Sibling | None, reason: str, hit: int) -> None:
        if sib is None:
            return
        self.kv_stats.choices[reason] += 1
        self.kv_stats.prefix_hit_tokens[sib.url] += hit
        self.kv_stats.hits.append(hit)

    def mark(self, sib: Sibling, healthy: bool) -> None:
        sib.healthy = healthy
        if not healthy:
            sib.retry_at = time.monotonic() + self.backoff

    @contextlib.contextmanager
    def busy(self, sib: Sibling, tokens: int = 0) -> Iterator[Sibling]:
        sib.outstanding += 1
        sib.queued_tokens += tokens
        try:
            yield sib
        finally:
            sib.outstanding -= 1
            sib.queued_tokens -= tokens


def sibling_headers(internal_key: str | None) -> dict[str, str]:
    """The credential a sibling's /internal/v1 endpoints take: the shared internal key (never a
    client's API key, which opens only the public API)."""
    return {"Authorization": f"Bearer {internal_key}"} if internal_key else {}
