"""create_engine(config): the engine --engine names; implementations are imported lazily.

Each engine gets only the parts it reads: the built-in core its EngineConfig (and the encode
siblings), TensorRT-LLM the EngineConfig and TrtllmConfig, the remote-prefill wrapper the
DisaggConfig.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from trtllm_gateway.config.disagg import encode_siblings
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.engine.logits.load import load_class
from trtllm_gateway.engine.protocol import Engine, EngineBase
from trtllm_gateway.engine.transport.attach import Attachment
from trtllm_gateway.engine.transport.launch import Launcher
from trtllm_gateway.engine.transport.loop import Addresses


def create_engine(config: GatewayConfig, attach: Attachment | None = None) -> EngineBase:
    """Construct (not start) the engine; loading happens in Engine.start() under the lifespan.

    A decode instance with --prefill-url gets its engine wrapped for remote prefill. attach: an
    API server of --api-server-count, whose built-in core a supervisor runs (launch_shared_core).
    """
    engine = _create_local(config, attach)
    if config.mode == "decode" and config.disagg.prefill_url:
        assert isinstance(engine, Engine)  # a decode instance generates
        from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine
        from trtllm_gateway.engine.stats import RemotePrefillStats

        return RemotePrefillEngine(engine, config.disagg, RemotePrefillStats())
    return engine


def preflight(config: GatewayConfig) -> None:
    """Fail before the server starts on what the chosen engine cannot run.

    Raises EngineError or ValueError whose str() is one line for the operator.
    """
    engine = config.engine
    if engine.engine == "trtllm":
        from trtllm_gateway.engine.trtllm.loader import preflight as trtllm_preflight

        trtllm_preflight(engine, config.trtllm, encode_siblings(config.disagg))
    if engine.engine == "builtin" and (engine.quantization == "fp8" or engine.fp8_kv):
        # --device auto resolved here as the loader will: FP8 on a CPU or an older GPU fails
        # now, not as a /health 503 after the server started.
        from trtllm_gateway.engine.builtin.device_dtype import pick_device
        from trtllm_gateway.engine.builtin.fp8 import unsupported

        reason = unsupported(pick_device(engine.device))
        if reason is not None:
            raise ValueError(reason)
    for path in engine.logits_processor:  # the engine imports it again where it runs
        load_class(path)


@contextmanager
def prestarted_core(config: GatewayConfig) -> Iterator[None]:
    """Where the built-in core will run in its own process: start that process now, importing
    the core's modules while the gateway imports and builds its app (engine/transport/process.py
    prestart: a server ready 0.7-1.0 s sooner on a 2-core VM), for the launch inside the block
    to take. One the block did not launch (a start that failed first) is ended as it exits."""
    from trtllm_gateway.engine.transport.process import discard_warm, prestart

    engine = config.engine
    if engine.engine == "builtin" and engine.mode != "encode" and engine.engine_process:
        prestart(("trtllm_gateway.engine.builtin.core",))
    try:
        yield
    finally:
        discard_warm()


def launch_shared_core(config: GatewayConfig, addresses: tuple[Addresses, ...]) -> Launcher:
    """Start the built-in core process that the API servers at `addresses` attach to."""
    from trtllm_gateway.engine.builtin.config import BuiltinConfig
    from trtllm_gateway.engine.builtin.core_launch import shared_core

    builtin = BuiltinConfig(config.engine, encode_siblings(config.disagg))
    return shared_core(builtin, config.server.log_level, addresses)


def _create_local(config: GatewayConfig, attach: Attachment | None = None) -> EngineBase:
    engine, log_level = config.engine, config.server.log_level
    encoders = encode_siblings(config.disagg)
    if engine.engine == "builtin" and engine.mode == "encode":
        from trtllm_gateway.engine.builtin.vision.encode_engine import EncodeEngine

        return EncodeEngine(engine)
    if engine.engine == "builtin":
        from trtllm_gateway.engine.builtin.config import BuiltinConfig
        from trtllm_gateway.engine.builtin.core_launch import core_client

        # --no-engine-process: the same core and messages, in a thread of this process.
        return core_client(
            BuiltinConfig(engine, encoders),
            log_level,
            in_thread=not engine.engine_process,
            attach=attach,
        )
    if engine.engine == "trtllm" and engine.mode == "encode":
        from trtllm_gateway.engine.trtllm.encode import TrtllmEncodeEngine

        return TrtllmEncodeEngine(engine, config.trtllm, log_level=log_level)
    if engine.engine == "trtllm":
        from trtllm_gateway.engine.trtllm.engine import TrtllmEngine

        return TrtllmEngine(engine, config.trtllm, encoders=encoders, log_level=log_level)
    raise ValueError(f"unknown engine {engine.engine!r}")
