"""With several API servers (prometheus_client's multiprocess mode), the counters each server keeps
in plain objects (image loads, a decode instance's prefill paths, KV-aware routing choices) are
summed over the servers on /metrics, whichever server answers; before, a scrape showed the
answering server's share alone. Each "server" is a process of its own, as under
--api-server-count: prometheus_client picks its file-backed values at import, from
PROMETHEUS_MULTIPROC_DIR. The text is parsed with prometheus_client's own parser."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

SERVER = textwrap.dedent(
    """
    import sys
    from prometheus_client import CollectorRegistry, generate_latest
    from trtllm_gateway.engine.stats import KvRoutingStats, RemotePrefillStats
    from trtllm_gateway.web.metrics import GatewayMetrics

    remote, scrape = int(sys.argv[1]), sys.argv[2] == "scrape"
    metrics = GatewayMetrics(CollectorRegistry(), multiprocess_dir=sys.argv[3])
    metrics.model_name = "m"
    stats, routing = RemotePrefillStats(), KvRoutingStats()
    metrics.bind_remote_prefill(stats)
    metrics.bind_kv_routing(routing)
    stats.siblings_healthy["http://p"] = scrape  # the syncing server skips the sibling
    stats.siblings_healthy["http://q"] = True
    for _ in range(remote):
        stats.record("remote")
        routing.choices["prefix"] += 1
        metrics.media.fetches[("data", "ok")] += 1
    stats.observe_transfer(1000 * remote, 0.01)
    if scrape:  # answered by this server: twice, nothing counted twice
        first = generate_latest(metrics.registry)
        assert generate_latest(metrics.registry) == first
        sys.stdout.write(first.decode())
    else:  # this server's periodic sync (app/lifespan.py), then it goes on without scrapes
        metrics.sync_counters()
        stats.record("remote")  # after its last sync: not seen until its next
    """
)


def _server(remote: int, what: str, files: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(files)}
    out = subprocess.run(
        [sys.executable, "-c", SERVER, str(remote), what, str(files)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"a series twice: {key}"  # the server's own and the files'
            out[key] = s.value
    return out


def test_counters_sum_over_api_servers_whichever_answers(tmp_path: Path) -> None:
    _server(3, "sync", tmp_path)
    got = _samples(_server(5, "scrape", tmp_path))
    remote = ("trtllm_gateway:remote_prefill_total", (("model_name", "m"), ("outcome", "remote")))
    assert got[remote] == 8.0
    assert got[(remote[0], (("model_name", "m"), ("outcome", "local_short")))] == 0.0
    fetches = (("outcome", "ok"), ("source", "data"))
    assert got[("trtllm_gateway:media_fetches_total", fetches)] == 8.0
    assert got[("trtllm_gateway:kv_routing_choices_total", (("reason", "prefix"),))] == 8.0
    assert got[("trtllm_gateway:kv_transfer_bytes_total", (("model_name", "m"),))] == 8000.0
    pulls = ("trtllm_gateway:kv_transfer_seconds_count", (("model_name", "m"),))
    assert got[pulls] == 2.0  # the histogram was in the files already: one pull a server
    # A sibling's health is the lowest of the servers' views, once: the answering server's
    # own says 1 for http://p, the other server's (in the files) 0.
    assert got[("trtllm_gateway:sibling_healthy", (("sibling", "http://p"),))] == 0.0
    assert got[("trtllm_gateway:sibling_healthy", (("sibling", "http://q"),))] == 1.0


RACE = textwrap.dedent(
    """
    import sys, threading
    from prometheus_client import CollectorRegistry, generate_latest
    from trtllm_gateway.engine.stats import RemotePrefillStats
    from trtllm_gateway.web.metrics import GatewayMetrics

    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    metrics = GatewayMetrics(CollectorRegistry(), multiprocess_dir=sys.argv[1])
    metrics.model_name = "m"
    stats = RemotePrefillStats()
    metrics.bind_remote_prefill(stats)
    stop = threading.Event()

    def sync() -> None:  # the lifespan's task and scrapes on worker threads, at once
        while not stop.is_set():
            metrics.sync_counters()
            generate_latest(metrics.registry)

    syncers = [threading.Thread(target=sync) for _ in range(4)]
    for t in syncers:
        t.start()
    for _ in range(3000):
        stats.record("remote")
    stop.set()
    for t in syncers:
        t.join()
    sys.stdout.write(generate_latest(metrics.registry).decode())
    """
)


def test_concurrent_syncs_add_each_gain_once(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", RACE, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    remote = ("trtllm_gateway:remote_prefill_total", (("model_name", "m"), ("outcome", "remote")))
    assert _samples(out)[remote] == 3000.0
