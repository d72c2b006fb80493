"""create_engine(settings): the engine --engine names; implementations are imported lazily."""

from __future__ import annotations

from pathlib import Path

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.logits.load import load_class
from trtllm_gateway.engine.protocol import Engine, EngineBase


def create_engine(settings: Settings) -> EngineBase:
    """Construct (not start) the engine; loading happens in Engine.start() under the lifespan.

    A decode instance with --prefill-url gets its engine wrapped for remote prefill.
    """
    engine = _create_local(settings)
    if settings.mode == "decode" and settings.prefill_url:
        assert isinstance(engine, Engine)  # a decode instance generates
        from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine
        from trtllm_gateway.engine.disagg.stats import RemotePrefillStats

        return RemotePrefillEngine(engine, settings, RemotePrefillStats())
    return engine


def preflight(settings: Settings) -> None:
    """Fail before the server starts on what the chosen engine cannot run.

    Raises EngineError or ValueError whose str() is one line for the operator.
    """
    if settings.engine == "trtllm":
        from trtllm_gateway.engine.trtllm.loader import preflight as trtllm_preflight

        trtllm_preflight(settings)
    for path in settings.logits_processor:  # the engine imports it again where it runs
        load_class(path)
    if settings.engine == "fake" and not Path(settings.tokenizer or settings.model).is_dir():
        # The fake engine has no model to take a tokenizer from: without one the server would
        # stay up answering /health 503 engine_dead.
        raise ValueError(
            "--engine fake needs a tokenizer directory: --tokenizer DIR (or --model DIR)"
        )


def _create_local(settings: Settings) -> EngineBase:
    if settings.engine == "builtin" and settings.mode == "encode":
        from trtllm_gateway.engine.builtin.vision.encode_engine import EncodeEngine

        return EncodeEngine(settings)
    if settings.engine == "builtin":
        from trtllm_gateway.engine.builtin.core_launch import core_client

        # --no-engine-process: the same core and messages, in a thread of this process.
        return core_client(settings, in_thread=not settings.engine_process)
    if settings.engine == "trtllm" and settings.mode == "encode":
        from trtllm_gateway.engine.trtllm.encode import TrtllmEncodeEngine

        return TrtllmEncodeEngine(settings)
    if settings.engine == "trtllm":
        from trtllm_gateway.engine.trtllm.engine import TrtllmEngine

        return TrtllmEngine(settings)
    if settings.engine == "fake":
        from trtllm_gateway.engine.fake import FakeEngine

        return FakeEngine.from_settings(settings)
    raise ValueError(f"unknown engine {settings.engine!r}")
