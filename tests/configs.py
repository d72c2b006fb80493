"""Configs the way the CLI builds them: flags (or Settings keywords) -> GatewayConfig -> engines.

Tests build every config through Settings.parts(), as app/cli.py does, so what a part holds,
its defaults and its model_fields_set (TensorRT-LLM sends some args only if given) are the
server's.
"""

from __future__ import annotations

from typing import Any

from trtllm_gateway.config.disagg import encode_siblings
from trtllm_gateway.config.engine_args import resolve_trtllm_args
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.transport.client import CoreClient


def resolve_args(*argv: str) -> GatewayConfig:
    """What `trtllm-gateway serve ARGV...` would run with."""
    return Settings(_cli_parse_args=list(argv)).parts()


def gateway(**fields: Any) -> GatewayConfig:
    """The configs of a Settings made of these keywords (one per flag, snake_case)."""
    return Settings(**fields).parts()


def builtin_config(**fields: Any) -> BuiltinConfig:
    """What the built-in core gets for these flags."""
    config = gateway(**fields)
    return BuiltinConfig(config.engine, encode_siblings(config.disagg))


def builtin_core_client(*, in_thread: bool = False, **fields: Any) -> CoreClient:
    from trtllm_gateway.engine.builtin.core_launch import core_client

    return core_client(builtin_config(**fields), in_thread=in_thread)


def trtllm_args(**fields: Any) -> dict[str, Any]:
    """The final TensorRT-LLM LLM args for these flags (--engine trtllm implied)."""
    config = gateway(**{"engine": "trtllm", **fields})
    return resolve_trtllm_args(config.engine, config.trtllm)


def trtllm_engine_of(config: GatewayConfig) -> Any:
    """The TrtllmEngine the factory makes for these configs."""
    from trtllm_gateway.engine.trtllm.engine import TrtllmEngine

    return TrtllmEngine(
        config.engine,
        config.trtllm,
        encoders=encode_siblings(config.disagg),
        log_level=config.server.log_level,
    )


def trtllm_engine(**fields: Any) -> Any:
    """A TrtllmEngine for these flags (--engine trtllm implied), as the factory makes it."""
    return trtllm_engine_of(gateway(**{"engine": "trtllm", **fields}))


def trtllm_encode_engine_of(config: GatewayConfig) -> Any:
    """The TrtllmEncodeEngine the factory makes for these configs (--mode encode)."""
    from trtllm_gateway.engine.trtllm.encode import TrtllmEncodeEngine

    return TrtllmEncodeEngine(config.engine, config.trtllm, log_level=config.server.log_level)


def trtllm_encode_engine(**fields: Any) -> Any:
    """A TrtllmEncodeEngine for these flags (--engine trtllm --mode encode implied)."""
    return trtllm_encode_engine_of(gateway(**{"engine": "trtllm", "mode": "encode", **fields}))
