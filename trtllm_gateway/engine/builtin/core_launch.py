"""core_client(config, log_level): the built-in EngineCore behind a CoreClient, in its process or
a thread.

The launcher gets a no-argument factory, functools.partial(build_core, config): in a process,
that (pickled) BuiltinConfig is all of the gateway's configuration the core ever sees. The core's
module (torch, the model code, the grammar matcher) is imported where the core is built: an API
server never imports it (2.7-4.4 s of a server's start on a 2-core VM, before its core could
start).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.transport.attach import AttachedCore, Attachment
from trtllm_gateway.engine.transport.client import CoreClient
from trtllm_gateway.engine.transport.inproc import ThreadLauncher
from trtllm_gateway.engine.transport.launch import Launcher
from trtllm_gateway.engine.transport.loop import Addresses
from trtllm_gateway.engine.transport.process import ProcessLauncher

if TYPE_CHECKING:
    from trtllm_gateway.engine.builtin.core import EngineCore


def build_core(config: BuiltinConfig) -> EngineCore:
    """The core, made where it runs (its process, or the thread of an in-process core)."""
    from trtllm_gateway.engine.builtin.core import EngineCore

    return EngineCore(config)


def core_factory(config: BuiltinConfig) -> partial[EngineCore]:
    """What a launcher calls to make the core (pickled whole into a core process)."""
    return partial(build_core, config)


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
