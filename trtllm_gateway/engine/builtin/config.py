"""BuiltinConfig: all a built-in EngineCore is given, pickled into its process.

The EngineConfig part and, with --encode-url, the encode siblings its image embedder calls (the
internal key they take comes with them). Nothing else of the gateway's configuration crosses:
no client API keys, no CORS, no server limits (tests/unit/test_core_factory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_gateway.config.disagg import EncodeSiblings
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.model_source import model_display_name


@dataclass(frozen=True, slots=True)
class BuiltinConfig:
    engine: EngineConfig
    encoders: EncodeSiblings | None = None

    @property
    def model_id(self) -> str:
        """The name the core announces: --served-model-name, else one made from --model."""
        return self.engine.served_model_name or model_display_name(self.engine.model)
