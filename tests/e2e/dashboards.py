"""Grafana dashboard queries against a live /metrics: which series each PromQL query selects.

Every target expression of a dashboard is parsed with promql-parser (the Rust PromQL parser's
Python binding), its Grafana variables filled in, and each vector selector looked up in a
/metrics scrape: a panel stays empty in Grafana when a selector finds no series, or, under
rate()/increase(), when its series do not move.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import promql_parser
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Selector:
    panel: str
    name: str
    labels: tuple[tuple[str, str], ...]  # equality matchers only (the dashboards use no others)
    ranged: bool  # inside a range (rate, increase): its samples must move


def dashboard_selectors(path: Path, model_name: str) -> list[Selector]:
    dashboard = json.loads(path.read_text())
    out: list[Selector] = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"].replace("$model_name", model_name)
            expr = expr.replace("$__rate_interval", "1m")
            out.extend(_selectors(promql_parser.parse(expr), panel["title"], ranged=False))
    return out


def _selectors(node: Any, panel: str, ranged: bool) -> list[Selector]:
    if isinstance(node, promql_parser.VectorSelector):
        labels = []
        for m in node.matchers.matchers:
            assert m.op == promql_parser.MatchOp.Equal, f"{panel}: matcher {m.op} not checked"
            labels.append((m.name, m.value))
        return [Selector(panel, node.name, tuple(labels), ranged)]
    if isinstance(node, promql_parser.MatrixSelector):
        return _selectors(node.vector_selector, panel, ranged=True)
    children: list[Any] = []
    if isinstance(node, promql_parser.Call):
        children = list(node.args)
    elif isinstance(node, promql_parser.BinaryExpr):
        children = [node.lhs, node.rhs]
    elif isinstance(
        node, promql_parser.AggregateExpr | promql_parser.ParenExpr | promql_parser.UnaryExpr
    ):
        children = [node.expr]
    out: list[Selector] = []
    for child in children:
        out.extend(_selectors(child, panel, ranged))
    return out


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def matching(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], sel: Selector) -> float:
    """The sum of the samples the selector picks; KeyError when it picks none."""
    found = [
        v for (name, labels), v in samples.items() if name == sel.name and set(sel.labels) <= labels
    ]
    if not found:
        raise KeyError(f"panel {sel.panel!r}: no series for {sel.name}{dict(sel.labels)}")
    return sum(found)
