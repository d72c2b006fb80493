"""The sweep grid: engine configs x concurrencies x (ISL, OSL), read from a YAML file.

    name: cpu-smollm2
    serve_args: [--device, cpu]          # given to every server the sweep starts
    concurrency: [1, 2, 4, 8, 16, 32]
    isl_osl: [[128, 128]]
    requests_per_concurrency: 4          # num prompts = max(min_requests, this x concurrency)
    min_requests: 8
    warmup: 2                            # short requests before the first point of a config
    workers: 1                           # bench.serve client processes (more at high concurrency)
    configs:
      - name: aggregated
        serve_args: [--max-batch-size, "32"]
      - name: prefill+decode            # one prefill sibling and one decode instance
        prefill_args: [--max-batch-size, "32"]
        decode_args: [--max-batch-size, "32", --max-local-prefill-tokens, "0"]
      - name: peer                      # any OpenAI server, already running
        url: http://127.0.0.1:9000
        gpus: 1

`gpus` is what "per GPU" divides by: one per server the sweep starts unless given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

Kind = Literal["aggregated", "disaggregated", "url"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    name: str
    kind: Kind
    serve_args: tuple[str, ...] = ()
    prefill_args: tuple[str, ...] = ()
    decode_args: tuple[str, ...] = ()
    url: str | None = None
    gpus: int = 1


@dataclass(frozen=True, slots=True)
class Grid:
    name: str
    configs: tuple[EngineConfig, ...]
    concurrency: tuple[int, ...]
    isl_osl: tuple[tuple[int, int], ...]
    serve_args: tuple[str, ...] = ()
    requests_per_concurrency: int = 4
    min_requests: int = 8
    warmup: int = 2
    workers: int = 1  # client processes of the built-in load generator

    def num_requests(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_per_concurrency * concurrency)

    def points(self) -> list[tuple[EngineConfig, int, int, int]]:
        """Every (config, concurrency, isl, osl), configs outermost (one server start each)."""
        return [
            (cfg, c, isl, osl)
            for cfg in self.configs
            for isl, osl in self.isl_osl
            for c in self.concurrency
        ]


class GridError(ValueError):
    """The YAML does not describe a grid; the message names the key."""


def _args(raw: Any, key: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return tuple(raw.split())
    if isinstance(raw, list):
        return tuple(str(x) for x in raw)
    raise GridError(f"{key}: a list of flags or one string, not {type(raw).__name__}")


def _ints(raw: Any, key: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(x, int) and x > 0 for x in raw):
        raise GridError(f"{key}: a non-empty list of positive integers")
    return tuple(raw)


def _config(raw: Any, i: int) -> EngineConfig:
    where = f"configs[{i}]"
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise GridError(f"{where}: a mapping with a name")
    known = {"name", "serve_args", "prefill_args", "decode_args", "url", "gpus"}
    if unknown := sorted(set(raw) - known):
        raise GridError(f"{where}: unknown keys {unknown}")
    disagg = "prefill_args" in raw or "decode_args" in raw
    if raw.get("url") and (disagg or "serve_args" in raw):
        raise GridError(f"{where}: url is a running server; it takes no serve/prefill/decode args")
    kind: Kind = "url" if raw.get("url") else "disaggregated" if disagg else "aggregated"
    gpus = raw.get("gpus", 2 if kind == "disaggregated" else 1)
    if not isinstance(gpus, int) or gpus < 1:
        raise GridError(f"{where}.gpus: a positive integer")
    return EngineConfig(
        name=raw["name"],
        kind=kind,
        serve_args=_args(raw.get("serve_args"), f"{where}.serve_args"),
        prefill_args=_args(raw.get("prefill_args"), f"{where}.prefill_args"),
        decode_args=_args(raw.get("decode_args"), f"{where}.decode_args"),
        url=raw.get("url"),
        gpus=gpus,
    )


def parse_grid(raw: Any) -> Grid:
    if not isinstance(raw, dict):
        raise GridError("the grid is a YAML mapping")
    configs = raw.get("configs")
    if not isinstance(configs, list) or not configs:
        raise GridError("configs: a non-empty list")
    parsed = tuple(_config(c, i) for i, c in enumerate(configs))
    names = [c.name for c in parsed]
    if len(set(names)) != len(names):
        raise GridError(f"configs: names must be unique, got {names}")
    pairs = raw.get("isl_osl", [[128, 128]])
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and x > 0 for x in p)
        for p in pairs
    ):
        raise GridError("isl_osl: a list of [input_len, output_len] pairs")
    return Grid(
        name=str(raw.get("name", "sweep")),
        configs=parsed,
        concurrency=_ints(raw.get("concurrency"), "concurrency"),
        isl_osl=tuple((int(a), int(b)) for a, b in pairs),
        serve_args=_args(raw.get("serve_args"), "serve_args"),
        requests_per_concurrency=int(raw.get("requests_per_concurrency", 4)),
        min_requests=int(raw.get("min_requests", 8)),
        warmup=int(raw.get("warmup", 2)),
        workers=int(raw.get("workers", 1)),
    )


def load_grid(path: Path) -> Grid:
    return parse_grid(yaml.safe_load(path.read_text()))
