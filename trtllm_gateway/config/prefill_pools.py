"""--prefill-pools: prompt-length ranges mapped to groups of prefill siblings.

    --prefill-pools '0-4096=http://p1:8000,http://p2:8000;4096-=http://p3:8000'

Ranges are [low, high) in prompt tokens, an empty high meaning no limit; they must not overlap.
A prompt whose length falls in no range may go to any --prefill-url sibling. Every URL must also
be in --prefill-url (which lists all siblings).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillPool:
    low: int
    high: int | None  # exclusive; None: no upper bound
    urls: tuple[str, ...]

    def holds(self, prompt_tokens: int) -> bool:
        return self.low <= prompt_tokens and (self.high is None or prompt_tokens < self.high)


def parse_prefill_pools(spec: str, prefill_urls: Sequence[str] = ()) -> tuple[PrefillPool, ...]:
    """ValueError naming the bad part; with prefill_urls, every pool URL must be one of them."""
    known = {u.rstrip("/") for u in prefill_urls}
    pools: list[PrefillPool] = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        span, sep, urls_text = part.partition("=")
        low_text, dash, high_text = span.strip().partition("-")
        urls = tuple(u.strip().rstrip("/") for u in urls_text.split(",") if u.strip())
        if not sep or not dash or not urls:
            raise ValueError(f"prefill pool {part!r}: expected LOW-HIGH=URL[,URL...]")
        try:
            low = int(low_text or 0)
            high = int(high_text) if high_text.strip() else None
        except ValueError:
            raise ValueError(f"prefill pool {part!r}: LOW and HIGH are token counts") from None
        if low < 0 or (high is not None and high <= low):
            raise ValueError(f"prefill pool {part!r}: needs 0 <= LOW < HIGH")
        if known and (missing := [u for u in urls if u not in known]):
            raise ValueError(f"prefill pool {part!r}: {missing} not in --prefill-url")
        pools.append(PrefillPool(low, high, urls))
    pools.sort(key=lambda p: p.low)
    for a, b in itertools.pairwise(pools):
        if a.high is None or a.high > b.low:
            raise ValueError(f"prefill pools overlap: {a.low}-{a.high} and {b.low}-{b.high}")
    if not pools:
        raise ValueError("--prefill-pools names no pool")
    return tuple(pools)


def pool_for(pools: Sequence[PrefillPool], prompt_tokens: int) -> PrefillPool | None:
    return next((p for p in pools if p.holds(prompt_tokens)), None)
