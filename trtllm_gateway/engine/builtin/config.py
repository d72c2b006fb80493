"""The built-in engine's core, as the gateway starts it: its Settings and its client.

The core gets the gateway's Settings without what only the HTTP side may hold (API keys).
"""

from __future__ import annotations

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.core.client import CoreClient
from trtllm_gateway.engine.core.inproc import ThreadLauncher
from trtllm_gateway.engine.core.launch import Launcher
from trtllm_gateway.engine.core.process import ProcessLauncher
from trtllm_gateway.engine.model_source import model_display_name


def engine_settings(settings: Settings) -> Settings:
    """A copy with the API keys dropped: a spawned core never sees the callers' secrets."""
    return settings.model_copy(update={"api_key": [], "api_key_file": None})


def core_client(settings: Settings, *, in_thread: bool = False) -> CoreClient:
    """The CoreClient over the built-in EngineCore: in its own process, or a thread."""
    core_settings = engine_settings(settings)
    launcher: Launcher = (
        ThreadLauncher(core_settings, EngineCore)
        if in_thread
        else ProcessLauncher(core_settings, EngineCore)
    )
    name = settings.served_model_name or model_display_name(settings.model)
    return CoreClient(launcher, name, settings.block_size)
