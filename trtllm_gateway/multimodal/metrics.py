"""MediaMetrics: plain counters the gateway's /metrics collector reads (no prometheus here)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

Source = Literal["http", "data", "file", "other"]
Outcome = Literal["ok", "rejected", "upstream_error", "timeout", "cancelled"]


@dataclass(slots=True)
class MediaMetrics:
    """Cumulative since start. fetches is keyed by (source, outcome)."""

    fetches: Counter[tuple[Source, Outcome]] = field(default_factory=Counter)
    bytes_loaded: Counter[Source] = field(default_factory=Counter)
    cache_hits: int = 0
    cache_misses: int = 0
    images_decoded: int = 0

    def record(self, source: Source, outcome: Outcome, nbytes: int = 0) -> None:
        self.fetches[(source, outcome)] += 1
        if nbytes:
            self.bytes_loaded[source] += nbytes
