"""Servers for one engine config of a sweep: started, healthy, stopped (or a URL as given)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from bench.disagg import _start, _stop
from bench.sweep_grid import EngineConfig


@contextlib.contextmanager
def serving(cfg: EngineConfig, common: tuple[str, ...], log_dir: Path) -> Iterator[str]:
    """Yield the base URL requests go to once every server of `cfg` answers /health."""
    if cfg.kind == "url":
        assert cfg.url is not None
        yield cfg.url.rstrip("/")
        return
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if cfg.kind == "aggregated":
            proc, url = _start([*common, *cfg.serve_args], log_dir / f"{cfg.name}.log")
            procs.append(proc)
        else:
            prefill = ["--mode", "prefill", *common, *cfg.prefill_args]
            proc, prefill_url = _start(prefill, log_dir / f"{cfg.name}-prefill.log")
            procs.append(proc)
            decode = ["--mode", "decode", "--prefill-url", prefill_url, *common, *cfg.decode_args]
            proc, url = _start(decode, log_dir / f"{cfg.name}-decode.log")
            procs.append(proc)
        yield url
    finally:
        for proc in reversed(procs):
            _stop(proc)
