"""RemotePrefillStats, KvRoutingStats: counters a decode instance keeps about prefill siblings.

Written by engine/disagg/remote_prefill.py and engine/disagg/siblings.py, read by the /metrics
collectors at scrape time (like EngineHealth) through EngineExtras, so nothing here depends on
prometheus. Kept out of disagg/: capabilities.py's EngineExtras names them, and disagg/ builds on
capabilities.py (the no-cycle contract).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# One per request, the path its prompt took (docs/metrics.md): remote on the first sibling
# asked; remote_retried after one or more busy answers; local_short under
# --max-local-prefill-tokens (or with images); local_logprobs (TensorRT-LLM); local_busy by
# BusyPolicy, every sibling busy; local_no_room, no KV room here in time; local_fallback after a
# sibling failure or with no healthy sibling; failed (--require-remote-prefill, a mismatch).
OUTCOMES = (
    "remote",
    "remote_retried",
    "local_short",
    "local_logprobs",
    "local_busy",
    "local_no_room",
    "local_fallback",
    "failed",
)


@dataclass
class RemotePrefillStats:
    outcomes: Counter[str] = field(default_factory=Counter)  # one of OUTCOMES per request
    kv_bytes: int = 0  # KV bytes pulled from siblings
    # KV pull latencies (seconds) not yet taken by the collector's histogram.
    kv_seconds: list[float] = field(default_factory=list)
    siblings_healthy: dict[str, bool] = field(default_factory=dict)
    busy_answers: Counter[str] = field(default_factory=Counter)  # 503s by sibling URL
    lease_renewals: int = 0  # hand-off leases renewed while a pull waited

    def record(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def observe_transfer(self, nbytes: int, seconds: float) -> None:
        self.kv_bytes += nbytes
        self.kv_seconds.append(seconds)

    def drain_kv_seconds(self) -> list[float]:
        out, self.kv_seconds = self.kv_seconds, []
        return out


@dataclass
class KvRoutingStats:
    """KV-aware sibling choices by reason (prefix, load) and the cached tokens they found."""

    choices: Counter[str] = field(default_factory=Counter)
    prefix_hit_tokens: Counter[str] = field(default_factory=Counter)  # by sibling URL
    # Cached-prefix tokens at the chosen sibling, one per choice, until a scrape takes them.
    hits: list[int] = field(default_factory=list)

    def drain_hits(self) -> list[int]:
        out, self.hits = self.hits, []
        return out
