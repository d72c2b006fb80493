"""Servers for one engine config of a sweep: started, healthy, stopped (or a URL as given)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path

from bench.disagg import Instance
from bench.sweep_grid import EngineConfig


@contextlib.contextmanager
def serving(cfg: EngineConfig, common: tuple[str, ...], log_dir: Path) -> Iterator[str]:
    """Yield the base URL requests go to once every server of `cfg` answers /health."""
    if cfg.kind == "url":
        assert cfg.url is not None
        yield cfg.url.rstrip("/")
        return
    started: list[Instance] = []
    try:
        if cfg.kind == "aggregated":
            started.append(Instance(cfg.name, [*common, *cfg.serve_args], "", log_dir).ready())
        else:
            # Siblings present a shared internal key: without one the prefill side's internal
            # endpoints answer 403 and every prompt is prefilled on the decode side.
            key = ["--internal-api-key", secrets.token_hex(16)]
            prefill = ["--mode", "prefill", *common, *key, *cfg.prefill_args]
            started.append(Instance(f"{cfg.name}-prefill", prefill, "", log_dir).ready())
            decode = ["--mode", "decode", "--prefill-url", started[0].url, *common, *key]
            decode += cfg.decode_args
            started.append(Instance(f"{cfg.name}-decode", decode, "", log_dir).ready())
        yield started[-1].url
    finally:
        for inst in reversed(started):
            inst.stop()
