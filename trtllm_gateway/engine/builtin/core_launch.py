"""core_client(settings): the built-in EngineCore behind a CoreClient, in its process or a thread.

The core gets the gateway's Settings without the API keys (config.engine_settings); it builds
its EngineConfig from them on its side of the boundary.
"""

from __future__ import annotations

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin.config import EngineConfig
from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.core.client import CoreClient
from trtllm_gateway.engine.core.inproc import ThreadLauncher
from trtllm_gateway.engine.core.launch import Launcher
from trtllm_gateway.engine.core.process import ProcessLauncher


def core_client(settings: Settings, *, in_thread: bool = False) -> CoreClient:
    """The CoreClient over the built-in EngineCore: in its own process, or a thread."""
    config = EngineConfig.from_settings(settings)
    launcher: Launcher = (
        ThreadLauncher(config.load, EngineCore)
        if in_thread
        else ProcessLauncher(config.load, EngineCore)
    )
    return CoreClient(launcher, config.model_id, config.block_size)


def thread_core(client: CoreClient) -> EngineCore:
    """The EngineCore behind a client made with in_thread=True, once started: a look inside
    for tests and the offline benchmarks (what it holds belongs to the core's thread)."""
    launcher = client.launcher
    if not isinstance(launcher, ThreadLauncher) or not isinstance(launcher.core, EngineCore):
        raise TypeError("not a started in-thread built-in engine core")
    return launcher.core
