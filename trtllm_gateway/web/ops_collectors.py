"""Scrape-time collectors over plain counter objects: admission, media loading, remote prefill.

Each reads its object when Prometheus scrapes, so the code that counts (app.admission,
multimodal.MediaMetrics, engine.remote_prefill_stats) never imports prometheus_client.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trtllm_gateway.engine.disagg.remote_encode import OUTCOMES as ENCODE_OUTCOMES
from trtllm_gateway.engine.stats import OUTCOMES, RemotePrefillStats
from trtllm_gateway.multimodal.metrics import MediaMetrics
from trtllm_gateway.multimodal.pixel_budget import PixelBudget
from trtllm_gateway.web.admission import AdmissionControl

PREFIX = "trtllm_gateway:"
# KV pulls: from a few ms (short prompt, loopback) to tens of seconds (long prompt over TCP).
KV_SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class AdmissionCollector(Collector):
    """Gateway-side load: requests admitted (in flight), queued beyond the engine batch, refused."""

    def __init__(self, admission: AdmissionControl) -> None:
        self._admission = admission

    def collect(self) -> Iterator[Metric]:
        a = self._admission
        yield _gauge(
            "num_requests_in_flight",
            "Engine requests admitted by the gateway and not yet finished.",
            a.total_in_flight,
        )
        yield _gauge(
            "num_requests_queued",
            "Admitted engine requests beyond the engine's running batch (--max-batch-size).",
            a.queued,
        )
        rejected = CounterMetricFamily(
            PREFIX + "admission_rejected",
            "Requests refused with 503 before any work, by reason.",
            labels=["reason"],
        )
        for reason, count in sorted(a.rejections().items()):
            rejected.add_metric([reason], float(count))
        yield rejected


class MediaCollector(Collector):
    """multimodal.MediaMetrics as trtllm_gateway:media_* counters, and the decoded-pixel
    budget's gauges."""

    def __init__(self, media: MediaMetrics, pixels: Callable[[], PixelBudget]) -> None:
        self._media = media
        self._pixels = pixels

    def collect(self) -> Iterator[Metric]:
        m = self._media
        fetches = CounterMetricFamily(
            PREFIX + "media_fetches",
            "Images loaded, by source and outcome.",
            labels=["source", "outcome"],
        )
        for (source, outcome), count in sorted(m.fetches.items()):
            fetches.add_metric([source, outcome], float(count))
        yield fetches
        loaded = CounterMetricFamily(
            PREFIX + "media_bytes_loaded", "Encoded image bytes loaded.", labels=["source"]
        )
        for source, nbytes in sorted(m.bytes_loaded.items()):
            loaded.add_metric([source], float(nbytes))
        yield loaded
        yield _counter("media_cache_hits", "Decoded-image cache hits.", m.cache_hits)
        yield _counter("media_cache_misses", "Decoded-image cache misses.", m.cache_misses)
        yield _counter("media_images_decoded", "Images decoded.", m.images_decoded)
        budget = self._pixels()
        yield _gauge(
            "image_pixels_in_flight",
            "Decoded image pixels held by requests (bound: --max-image-pixels-in-flight).",
            budget.in_flight,
        )
        yield _gauge(
            "image_pixels_in_flight_peak",
            "The most decoded image pixels requests have held at once since start.",
            budget.peak,
        )
        yield _gauge(
            "image_requests_waiting",
            "Requests waiting for room in the decoded-pixel budget.",
            budget.waiting,
        )


class RemotePrefillCollector(Collector):
    """engine RemotePrefillStats, once bound (decode instances with --prefill-url)."""

    def __init__(self, model_name: Callable[[], str], multiprocess: bool = False) -> None:
        self._model_name = model_name
        self._multiprocess = multiprocess  # the histogram is read from the files
        self._stats: RemotePrefillStats | None = None
        # The stats keep raw KV pull latencies until a scrape moves them into this histogram.
        self._kv_seconds = Histogram(
            PREFIX + "kv_transfer_seconds",
            "Seconds to pull one request's KV from a prefill sibling.",
            ["model_name"],
            buckets=KV_SECONDS_BUCKETS,
            registry=None,
        )

    def bind(self, stats: RemotePrefillStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        if stats is None:
            return
        model = self._model_name()
        outcomes = CounterMetricFamily(
            PREFIX + "remote_prefill",
            "Requests by the path their prompt took: remote, remote_retried (after busy "
            "siblings), local_short, local_logprobs, local_busy (by policy), local_no_room, "
            "local_fallback (after a failure), failed.",
            labels=["model_name", "outcome"],
        )
        for outcome in sorted({*OUTCOMES, *stats.outcomes}):
            outcomes.add_metric([model, outcome], float(stats.outcomes.get(outcome, 0)))
        yield outcomes
        busy = CounterMetricFamily(
            PREFIX + "remote_prefill_busy",
            "Busy (503) answers of prefill siblings, each retried or prefilled locally.",
            labels=["model_name", "sibling"],
        )
        for url, n in sorted(stats.busy_answers.items()):
            busy.add_metric([model, url], float(n))
        yield busy
        renewals = CounterMetricFamily(
            PREFIX + "kv_lease_renewals",
            "Hand-off leases renewed at prefill siblings while a KV pull waited.",
            labels=["model_name"],
        )
        renewals.add_metric([model], float(stats.lease_renewals))
        yield renewals
        kv_bytes = CounterMetricFamily(
            PREFIX + "kv_transfer_bytes", "KV bytes pulled from siblings.", labels=["model_name"]
        )
        kv_bytes.add_metric([model], float(stats.kv_bytes))
        yield kv_bytes
        histogram = self._kv_seconds.labels(model)
        for seconds in stats.drain_kv_seconds():
            histogram.observe(seconds)
        if not self._multiprocess:
            yield from self._kv_seconds.collect()
        healthy = GaugeMetricFamily(
            PREFIX + "sibling_healthy",
            "1 while a prefill sibling answers, 0 while it is skipped.",
            labels=["sibling"],
        )
        for url, ok in sorted(stats.siblings_healthy.items()):
            healthy.add_metric([url], 1.0 if ok else 0.0)
        yield healthy


class RemoteEncodeCollector(Collector):
    """Remote-encode outcomes (EngineExtras.remote_encode), once bound (--encode-url)."""

    def __init__(self, model_name: Callable[[], str]) -> None:
        self._model_name = model_name
        self._outcomes: Counter[str] | None = None

    def bind(self, outcomes: Counter[str]) -> None:
        self._outcomes = outcomes

    def collect(self) -> Iterator[Metric]:
        if self._outcomes is None:
            return
        family = CounterMetricFamily(
            PREFIX + "remote_encode",
            "Image batches by encoder placement: remote, local_fallback.",
            labels=["model_name", "outcome"],
        )
        for outcome in sorted({*ENCODE_OUTCOMES, *self._outcomes}):
            family.add_metric([self._model_name(), outcome], float(self._outcomes[outcome]))
        yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(PREFIX + name, doc)
    gauge.add_metric([], float(value))
    return gauge


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    counter = CounterMetricFamily(PREFIX + name, doc)
    counter.add_metric([], float(value))
    return counter
