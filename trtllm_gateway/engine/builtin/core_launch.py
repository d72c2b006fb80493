"""core_client(config, log_level): the built-in EngineCore behind a CoreClient, in its process or
a thread.

The launcher gets a no-argument factory, functools.partial(EngineCore, config): in a process,
that (pickled) BuiltinConfig is all of the gateway's configuration the core ever sees.
"""

from __future__ import annotations

from functools import partial

from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.transport.attach import AttachedCore, Attachment
from trtllm_gateway.engine.transport.client import CoreClient
from trtllm_gateway.engine.transport.inproc import ThreadLauncher
from trtllm_gateway.engine.transport.launch import Launcher
from trtllm_gateway.engine.transport.loop import Addresses
from trtllm_gateway.engine.transport.process import ProcessLauncher


def core_factory(config: BuiltinConfig) -> partial[EngineCore]:
    """What a launcher calls to make the core (pickled whole into a core process)."""
    return partial(EngineCore, config)


def shared_core(
    config: BuiltinConfig, log_level: str, addresses: tuple[Addresses, ...]
) -> ProcessLauncher:
    """The core process for several API servers (--api-server-count), started; its owner (the
    supervisor) joins or kills it."""
    launcher = ProcessLauncher(core_factory(config), log_level)
    launcher.launch(addresses)
    return launcher


def core_client(
    config: BuiltinConfig,
    log_level: str = "info",
    *,
    in_thread: bool = False,
    attach: Attachment | None = None,
) -> CoreClient:
    """The CoreClient over the built-in EngineCore: in its own process, or a thread, or (attach)
    the process a supervisor started for several API servers."""
    if attach is not None:
        attached = AttachedCore(attach.core_pid)
        return CoreClient(attached, config.model_id, config.engine.block_size, attach.addresses)
    factory = core_factory(config)
    launcher: Launcher = (
        ThreadLauncher(factory) if in_thread else ProcessLauncher(factory, log_level)
    )
    return CoreClient(launcher, config.model_id, config.engine.block_size)
