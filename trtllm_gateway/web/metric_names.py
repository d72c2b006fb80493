"""The engine metrics' name prefix: `trtllm_gateway:` inside, `--metrics-prefix` on /metrics.

Every collector names its families under PREFIX; when the served prefix differs (`vllm:`, so that
vLLM's Grafana dashboards and PromQL work unchanged), RenamedCollector rewrites the names of the
families and samples it passes through at scrape time. Names without the prefix (the HTTP
metrics of prometheus-fastapi-instrumentator) pass as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

PREFIX = "trtllm_gateway:"
# A Prometheus metric name may hold letters, digits, '_' and ':' and not start with a digit.
VALID_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class RenamedCollector(Collector):
    """Everything `inner` collects, with PREFIX replaced by `prefix` in family and sample names."""

    def __init__(self, inner: Collector, prefix: str) -> None:
        self._inner = inner
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        if self._prefix == PREFIX:
            yield from self._inner.collect()
            return
        for family in self._inner.collect():
            if not family.name.startswith(PREFIX):
                yield family
                continue
            renamed = Metric(self._rename(family.name), family.documentation, family.type)
            renamed.unit = family.unit
            renamed.samples = [s._replace(name=self._rename(s.name)) for s in family.samples]
            yield renamed

    def _rename(self, name: str) -> str:
        return self._prefix + name[len(PREFIX) :] if name.startswith(PREFIX) else name
