"""EngineConfig: the settings the built-in engine needs, read once from the gateway's Settings.

EngineCore builds it on its side of the boundary and reads its limits from it, never from loose
Settings fields; the model loader and the image embedder get
`load`, the Settings without what only the HTTP side may hold (API keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.model_source import model_display_name
from trtllm_gateway.engine.protocol import Mode


def engine_settings(settings: Settings) -> Settings:
    """A copy with the client API keys dropped: a spawned core never sees the callers' secrets.

    The internal key stays: the core's remote encoder presents it to encode siblings."""
    return settings.model_copy(update={"api_key": [], "api_key_file": None})


@dataclass(frozen=True, slots=True)
class EngineConfig:
    load: Settings  # for the loader and the image embedder; API keys dropped
    model_id: str
    mode: Mode
    seed: int  # seeds the generator of each request that gives no seed
    stream_interval: int
    block_size: int
    max_batch_size: int
    max_num_tokens: int
    kv_handoff_timeout: float
    max_held_kv_fraction: float
    data_parallel_rank: int = 0  # named by the KV events
    logits_processors: tuple[str, ...] = ()  # module:Class paths, loaded in the core
    test_logits_processor: bool = False
    grammar_compile_timeout: float = 10.0  # seconds a request's matcher may take to build

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineConfig:
        return cls(
            load=engine_settings(settings),
            model_id=settings.served_model_name or model_display_name(settings.model),
            mode=settings.mode,
            seed=settings.seed,
            stream_interval=settings.stream_interval,
            block_size=settings.block_size,
            max_batch_size=settings.max_batch_size,
            max_num_tokens=settings.max_num_tokens,
            kv_handoff_timeout=settings.kv_handoff_timeout,
            max_held_kv_fraction=settings.max_held_kv_fraction,
            data_parallel_rank=settings.data_parallel_rank,
            logits_processors=tuple(settings.logits_processor),
            test_logits_processor=settings.enable_test_logits_processor,
            grammar_compile_timeout=settings.grammar_compile_timeout,
        )
