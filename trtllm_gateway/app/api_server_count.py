"""--api-server-count auto (its default): how many API server processes this host runs.

One API server's event loop renders and sends ~15k SSE chunks a second on an H100 host's core
(docs/benchmarks.md, "The API server's cost a chunk"), and the built-in engine on a GPU emits
four to five times that at a large batch of a small model; so a GPU host of at least MIN_CORES
cores runs one server per CORES_PER_SERVER cores, at most MAX_AUTO (a 16-core host: 8, which
served the 135M at 256 running 1.20x faster than 4 on a 16-core H200 host, and 1.09-1.15x with
the load generator on other cores: docs/benchmarks.md, "API servers: eight on a 16-core host").
A CPU engine needs the cores itself and emits far fewer tokens: 1.
"""

from __future__ import annotations

import dataclasses
import os

from trtllm_gateway.config.api_servers import unshareable
from trtllm_gateway.config.gateway import GatewayConfig

MAX_AUTO = 8
CORES_PER_SERVER = 2
MIN_CORES = 8  # fewer: the engine core, the tokenizers and one server share them


def resolve_api_servers(config: GatewayConfig) -> GatewayConfig:
    """The configuration with --api-server-count decided: as given, else auto."""
    count = api_server_count(config, usable_cores(), gpu=None)
    server = config.server.model_copy(update={"api_server_count": count})
    return dataclasses.replace(config, server=server)


def api_server_count(config: GatewayConfig, cores: int, gpu: bool | None) -> int:
    """gpu: whether --device auto finds a GPU (None: ask the driver)."""
    asked = config.server.api_server_count
    if asked is not None:
        return asked
    if unshareable(config.engine, config.disagg) is not None:
        return 1
    count = min(MAX_AUTO, cores // CORES_PER_SERVER)
    device = config.engine.device
    if cores < MIN_CORES or device == "cpu":
        return 1
    if not device.startswith("cuda") and not (_has_gpu() if gpu is None else gpu):
        return 1
    return count


def usable_cores() -> int:
    """The cores this process may run on (a container's cpuset, taskset), not the host's;
    where the OS cannot say (macOS has no sched_getaffinity), the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _has_gpu() -> bool:
    # torch asks NVML first, which leaves this process free to fork (torch.cuda.device_count's
    # note): the supervisor starts the engine core after this.
    import torch

    return torch.cuda.device_count() > 0
