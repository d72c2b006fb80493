"""Prometheus collectors (vLLM's names, under trtllm_gateway: or --metrics-prefix) and
per-request recording.

One CollectorRegistry per app, so several apps in one process do not collide. With
--api-server-count N (PROMETHEUS_MULTIPROC_DIR set by the supervisor) prometheus_client keeps
every histogram and counter in per-process files, and /metrics sums them over all the servers
(its multiprocess mode, as vLLM runs it); the scrape-time collectors below report once, from the
server that answers: the engine gauges come from the one shared core and the admission counts
from the servers' shared counters. Gauges are read
from engine.health() at scrape time; histograms and counters are fed by RequestRecorder. The
admission counters, multimodal.MediaMetrics and engine RemotePrefillStats are plain objects read
at scrape time too (web/ops_collectors.py), so nothing below the app layer knows prometheus.
Every series vLLM's example Grafana dashboard queries is here (deploy/grafana/, tested against a
live /metrics). No `*_created` series: vLLM turned them off too (disable_created_metrics in its
engine/metrics.py); Prometheus detects counter resets itself.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from trtllm_gateway.engine.protocol import EngineHealth, FinishReason, TokenEvent
from trtllm_gateway.engine.stats import KvRoutingStats, RemotePrefillStats
from trtllm_gateway.multimodal.metrics import MediaMetrics
from trtllm_gateway.multimodal.pixel_budget import PixelBudget
from trtllm_gateway.web import request_context
from trtllm_gateway.web.admission import AdmissionControl
from trtllm_gateway.web.counter_mirror import CounterMirror, GaugesOnly, SyncedFirst
from trtllm_gateway.web.metric_names import PREFIX, RenamedCollector
from trtllm_gateway.web.ops_collectors import (
    AdmissionCollector,
    MediaCollector,
    RemoteEncodeCollector,
    RemotePrefillCollector,
)

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class _EngineCollector(Collector):
    """Gauges and cumulative engine counters read from health() when Prometheus scrapes."""

    def __init__(self, health: Callable[[], EngineHealth | None], model_name: Callable[[], str]):
        self._health = health
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        health = self._health()
        if health is None:
            return
        labels = ["model_name"]
        values = [self._model_name()]
        gauges = {
            "num_requests_running": ("Requests in the running batch.", health.running),
            "num_requests_waiting": ("Requests waiting to be scheduled.", health.waiting),
            "kv_cache_usage_perc": ("KV-cache usage, 1 means 100 percent.", health.kv_usage),
            # Absolute, as Dynamo's workers publish them (kv_active_blocks / kv_total_blocks).
            "kv_active_blocks": ("KV-cache blocks held by requests.", health.kv_active_blocks),
            "kv_total_blocks": ("KV-cache blocks in all.", health.kv_total_blocks),
        }
        for name, (doc, value) in gauges.items():
            gauge = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            gauge.add_metric(values, float(value))
            yield gauge
        counters = {
            "num_preemptions": ("Cumulative preemptions.", health.preemptions),
            "prefix_cache_queries": ("Prompt tokens looked up.", health.prefix_cache_queries),
            "prefix_cache_hits": ("Prompt tokens found cached.", health.prefix_cache_hits),
            "kv_handoffs": (
                "KV hand-offs begun with siblings (staged for one, or loaded from one).",
                health.kv_handoffs,
            ),
            "kv_handoff_step_seconds": (
                "The engine step thread's seconds spent on KV hand-offs.",
                health.kv_handoff_step_seconds,
            ),
        }
        for name, (doc, value) in counters.items():
            counter = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            counter.add_metric(values, float(value))
            yield counter


_HIT_TOKEN_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536)
# Tokens per request: vLLM's 1-2-5 series (build_1_2_5_buckets), here up to 1M tokens.
_TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))[:-2]


class _KvRoutingCollector(Collector):
    """A decode instance's KV-aware sibling choices (docs/kv_events.md), once bound."""

    def __init__(self, multiprocess: bool = False) -> None:
        self.stats: KvRoutingStats | None = None
        self._multiprocess = multiprocess  # the histogram is read from the files
        self._hits = Histogram(
            PREFIX + "kv_routing_prefix_hit_tokens",
            "Prompt tokens cached at the prefill sibling chosen, per choice.",
            buckets=_HIT_TOKEN_BUCKETS,
            registry=None,
        )

    def collect(self) -> Iterator[Metric]:
        if self.stats is None:
            return
        choices = CounterMetricFamily(
            PREFIX + "kv_routing_choices",
            "Prefill sibling choices: by cached prefix (prefix) or by load only (load).",
            labels=["reason"],
        )
        for reason in ("prefix", "load"):
            choices.add_metric([reason], float(self.stats.choices.get(reason, 0)))
        yield choices
        by_sibling = CounterMetricFamily(
            PREFIX + "kv_routing_hit_tokens",
            "Cached prompt tokens found at the chosen prefill sibling, by sibling.",
            labels=["sibling"],
        )
        for url, tokens in sorted(self.stats.prefix_hit_tokens.items()):
            by_sibling.add_metric([url], float(tokens))
        yield by_sibling
        for hit in self.stats.drain_hits():
            self._hits.observe(hit)
        if not self._multiprocess:
            yield from self._hits.collect()


class GatewayMetrics:
    """Every engine/request metric of one app, registered in its own registry."""

    def __init__(
        self,
        registry: CollectorRegistry,
        admission: AdmissionControl | None = None,
        prefix: str = PREFIX,
        multiprocess_dir: str | None = None,
    ) -> None:
        """`registry` is the one /metrics exposes; the engine metrics live in a registry of
        their own, renamed to `prefix` on the way out (web/metric_names.py). multiprocess_dir:
        prometheus_client's PROMETHEUS_MULTIPROC_DIR, whose files /metrics sums instead."""
        disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide, as vLLM does
        self.registry = registry
        inner = CollectorRegistry()
        # Scrape-time collectors: with one process in `inner`, with several in their own
        # registry, since `inner`'s histograms and counters then come from the files.
        scraped = inner if multiprocess_dir is None else CollectorRegistry()
        # Where the HTTP metrics (prometheus-fastapi-instrumentator) register.
        self.http_registry = registry if multiprocess_dir is None else inner
        mp = multiprocess_dir is not None
        self._health: Callable[[], EngineHealth] | None = None
        self.model_name = ""
        self.admission = admission or AdmissionControl(running=1, queued=None)
        # Filled by the image loader (routers/openai/chat/images.py) and read at scrape time.
        self.media = MediaMetrics()
        # Decoded pixels held by requests; create_app gives it the configured bound.
        self.pixels = PixelBudget(0)
        self._remote_prefill = RemotePrefillCollector(lambda: self.model_name, mp)
        self._remote_encode = RemoteEncodeCollector(lambda: self.model_name)
        self._kv_routing = _KvRoutingCollector(mp)
        label = ["model_name"]

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, label, registry=inner, buckets=buckets)

        def counter(name: str, doc: str, labels: list[str] = label) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=inner)

        self.ttft = histogram(
            "time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS
        )
        self.itl = histogram("inter_token_latency_seconds", "Inter-token latency.", _ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end latency.", _LATENCY_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Time queued.", _LATENCY_BUCKETS)
        self.prefill = histogram("request_prefill_time_seconds", "Prefill time.", _LATENCY_BUCKETS)
        self.decode = histogram("request_decode_time_seconds", "Decode time.", _LATENCY_BUCKETS)
        self.tpot = histogram(
            "request_time_per_output_token_seconds",
            "Per request: time from the first token to the last over the tokens after the first.",
            _ITL_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens per request.", _TOKEN_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens per request.", _TOKEN_BUCKETS
        )
        self.max_generation_tokens = histogram(
            "request_max_num_generation_tokens",
            "Per HTTP request: the most tokens one of its choices generated.",
            _TOKEN_BUCKETS,
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of the requests that ended.")
        self.generation_tokens = counter("generation_tokens", "Generation tokens produced.")
        self.success = counter(
            "request_success", "Finished requests by finish reason.", [*label, "finished_reason"]
        )
        self.disconnects = Counter(
            PREFIX + "http_requests_client_disconnected",
            "Clients that disconnected before their response ended.",
            registry=inner,
        )
        scraped.register(_EngineCollector(self._read_health, lambda: self.model_name))
        scraped.register(AdmissionCollector(self.admission))
        scraped.register(self._remote_encode)
        # Counted by each API server on its own: with several, their counters go to the files.
        own: list[Collector] = [
            MediaCollector(self.media, lambda: self.pixels),
            self._remote_prefill,
            self._kv_routing,
        ]
        self.mirror = CounterMirror(own) if mp else None
        for collector in own:
            scraped.register(
                collector if self.mirror is None else GaugesOnly(collector, self.mirror)
            )
        if multiprocess_dir is not None:
            assert self.mirror is not None
            files = CollectorRegistry()
            MultiProcessCollector(files, path=multiprocess_dir)  # type: ignore[no-untyped-call]
            registry.register(RenamedCollector(SyncedFirst(self.mirror, files), prefix))
            registry.register(RenamedCollector(scraped, prefix))
        else:
            registry.register(RenamedCollector(inner, prefix))

    def sync_counters(self) -> None:
        """With several API servers: this one's own counters into the shared files (the
        lifespan calls it every second; a scrape this server answers does it too)."""
        if self.mirror is not None:
            self.mirror.sync()

    def bind_engine(self, health: Callable[[], EngineHealth], model_name: str) -> None:
        self._health = health
        self.model_name = model_name

    def unbind_engine(self) -> None:
        """The engine stopped: scrapes no longer read it, and nothing here keeps it (and its
        model) alive. FastAPI caches the /metrics endpoint's function process-wide
        (fastapi/dependencies/models.py, _is_async_gen_callable_cached), so an app's metrics
        outlive it: each app of a test session kept its stopped engine, 2-3 GiB on CPU."""
        self._health = None

    def bind_remote_prefill(self, stats: RemotePrefillStats) -> None:
        """Export a remote-prefill engine's counters (decode instances with --prefill-url)."""
        self._remote_prefill.bind(stats)

    def bind_kv_routing(self, stats: KvRoutingStats) -> None:
        """Export KV-aware routing choices (decode instances following 2+ prefill siblings)."""
        self._kv_routing.stats = stats

    def bind_remote_encode(self, outcomes: collections.Counter[str]) -> None:
        """Export remote-encode outcomes (vision instances with --encode-url)."""
        self._remote_encode.bind(outcomes)

    def _read_health(self) -> EngineHealth | None:
        return self._health() if self._health is not None else None

    def client_disconnected(self) -> None:
        self.disconnects.inc()

    def recorders(self, arrival: float, count: int) -> list[RequestRecorder]:
        """One recorder per engine request of one HTTP request (its choices)."""
        group = _Group(self.max_generation_tokens.labels(self.model_name), count)
        return [RequestRecorder(self, arrival, group) for _ in range(count)]


class _Group:
    """The choices of one HTTP request: the most tokens one generated, once all have ended."""

    def __init__(self, histogram: Histogram, count: int) -> None:
        self._histogram = histogram
        self._left = count
        self._most = 0

    def ended(self, generated: int) -> None:
        self._most = max(self._most, generated)
        self._left -= 1
        if self._left == 0:
            self._histogram.observe(self._most)


class RequestRecorder:
    """Timing of one engine request, measured from HTTP arrival (like vLLM's TTFT)."""

    def __init__(self, metrics: GatewayMetrics, arrival: float, group: _Group) -> None:
        self._m = metrics
        self._arrival = arrival
        self._group = group
        self._first: float | None = None
        self._last: float | None = None
        self._generated = 0
        self._done = False
        # The request's log context (shared by its choices): model, tokens, TTFT, finish.
        self._ctx = request_context.current()
        if self._ctx is not None:
            self._ctx.model = metrics.model_name
        # The per-token series, looked up once: labels() costs more than observe() itself.
        model = metrics.model_name
        self._itl = metrics.itl.labels(model)
        self._generation_tokens = metrics.generation_tokens.labels(model)

    def on_event(self, event: TokenEvent) -> None:
        now = time.monotonic()
        model = self._m.model_name
        ctx = self._ctx
        if self._last is None:
            self._first = now
            ttft = now - self._arrival
            self._m.ttft.labels(model).observe(ttft)
            if ctx is not None and (ctx.ttft_s is None or ttft < ctx.ttft_s):
                ctx.ttft_s = ttft
        elif event.token_ids:
            self._itl.observe(now - self._last)
        self._last = now
        if event.token_ids:
            self._generated += len(event.token_ids)
            self._generation_tokens.inc(len(event.token_ids))
            if ctx is not None:
                ctx.completion_tokens += len(event.token_ids)
        if event.timings is not None:
            if ctx is not None:
                ctx.timings = event.timings
            self._m.queue.labels(model).observe(event.timings.queue_s)
            self._m.prefill.labels(model).observe(event.timings.prefill_s)
            self._m.decode.labels(model).observe(event.timings.decode_s)

    def finish(self, reason: FinishReason | None, prompt_tokens: int) -> None:
        """Count the outcome and the prompt once, whoever ended the request: the engine, a stop
        string, a client that left or an abort; None means it ended without a finish."""
        if self._done:
            return
        self._done = True
        model = self._m.model_name
        self._m.prompt_tokens.labels(model).inc(prompt_tokens)
        if self._ctx is not None:
            self._ctx.prompt_tokens += prompt_tokens
        self._m.request_prompt_tokens.labels(model).observe(prompt_tokens)
        self._m.request_generation_tokens.labels(model).observe(self._generated)
        self._group.ended(self._generated)
        # vLLM's mean time per output token: decode time over the tokens after the first.
        tpot = 0.0
        if self._first is not None and self._last is not None and self._generated > 1:
            tpot = (self._last - self._first) / (self._generated - 1)
        self._m.tpot.labels(model).observe(tpot)
        self._m.success.labels(model, reason or "abort").inc()
        if self._ctx is not None:
            self._ctx.finish_reasons.append(reason or "abort")
        self._m.e2e.labels(model).observe(time.monotonic() - self._arrival)
