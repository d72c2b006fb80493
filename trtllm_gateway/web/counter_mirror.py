"""CounterMirror: per-process counters of scrape-time collectors, mirrored into prometheus_client's
multiprocess files, so that /metrics sums them over every API server.

With --api-server-count N each API server counts its own image loads (MediaMetrics) and its own
prompts' prefill paths (RemotePrefillStats, KvRoutingStats) in plain objects. A scrape is answered
by one server, so reading those objects at scrape time showed that server's share alone (a
decode instance with four servers reported 37 of 96 prompts' paths). Here each server turns what
those collectors report into prometheus_client Counters, written to its own file and summed by
MultiProcessCollector, at every scrape it answers and once a second (app/lifespan.py); the
scrape-time registry keeps only their gauges (GaugesOnly). Counters whose values come from the
one shared engine core (its health counters, remote encode outcomes) are not mirrored: every
server holds the same totals, and a sum would count them N times.

A gauge that is each server's own view (MIN_GAUGES: `sibling_healthy`, which each server learns
from its own requests to a prefill sibling) is mirrored as a prometheus_client Gauge in
`livemin` mode: /metrics shows the lowest of the servers' values, so a sibling any server skips
reads 0 whichever server answers (before, a scrape showed the answering server's view, and with
eight servers the series could flip between scrapes).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

MIN_GAUGES = frozenset({"trtllm_gateway:sibling_healthy"})


class CounterMirror:
    def __init__(self, collectors: list[Collector]) -> None:
        self._collectors = collectors
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        self._seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        # The lifespan's sync runs on the event loop and a scrape's on a worker thread
        # (the instrumentator's /metrics handler is sync): one at a time, or a gain is added
        # twice. The collectors' own collect() (which drains raw histogram samples) too.
        self.lock = threading.Lock()

    def sync(self) -> None:
        """Add what each counter gained since the last sync to this process's file."""
        with self.lock:
            for collector in self._collectors:
                for family in collector.collect():
                    if family.type == "counter":
                        self._mirror(family)
                    elif family.name in MIN_GAUGES:
                        self._mirror_gauge(family)

    def _mirror_gauge(self, family: Metric) -> None:
        gauge = self._gauges.get(family.name)
        for sample in family.samples:
            if gauge is None:
                gauge = self._gauges[family.name] = Gauge(
                    family.name,
                    family.documentation,
                    list(sample.labels),
                    registry=None,
                    multiprocess_mode="livemin",
                )
            (gauge.labels(**sample.labels) if sample.labels else gauge).set(sample.value)

    def _mirror(self, family: Metric) -> None:
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            counter = self._counters.get(family.name)
            if counter is None:
                counter = Counter(
                    family.name, family.documentation, list(sample.labels), registry=None
                )
                self._counters[family.name] = counter
            child = counter.labels(**sample.labels) if sample.labels else counter
            key = (family.name, tuple(sample.labels.items()))
            gained = sample.value - self._seen.get(key, 0.0)
            if gained > 0:
                child.inc(gained)
                self._seen[key] = sample.value


class GaugesOnly(Collector):
    """A collector's families less its counters (CounterMirror writes those to the files)."""

    def __init__(self, inner: Collector, mirror: CounterMirror) -> None:
        self._inner = inner
        self._mirror = mirror

    def collect(self) -> Iterator[Metric]:
        with self._mirror.lock:
            families = [
                f for f in self._inner.collect() if f.type != "counter" and f.name not in MIN_GAUGES
            ]
        return iter(families)


class SyncedFirst(Collector):
    """The multiprocess files, read after this process's counters are mirrored into them."""

    def __init__(self, mirror: CounterMirror, files: Collector) -> None:
        self._mirror = mirror
        self._files = files

    def collect(self) -> Iterator[Metric]:
        self._mirror.sync()
        yield from self._files.collect()
