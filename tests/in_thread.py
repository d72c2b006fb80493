"""thread_core(client): the EngineCore behind an in-thread CoreClient, for tests and the offline
benchmarks (bench/offline.py) to look inside; no part of the package.

What the core holds belongs to its thread: read it between requests, or for what a race cannot
spoil (a counter, the loaded model).
"""

from __future__ import annotations

from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.transport.client import CoreClient
from trtllm_gateway.engine.transport.inproc import ThreadLauncher


def thread_core(client: CoreClient) -> EngineCore:
    """The EngineCore behind a client made with core_client(..., in_thread=True), once started."""
    launcher = client.launcher
    if not isinstance(launcher, ThreadLauncher) or not isinstance(launcher.core, EngineCore):
        raise TypeError("not a started in-thread built-in engine core")
    return launcher.core
