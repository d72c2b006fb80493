"""GatewayConfig: the parts of one instance's configuration, each handed to the code that owns it.

Built once from the CLI (Settings.parts(), app/cli.py): the server gets ServerConfig, the OpenAI
layer ServingConfig, the engine factory EngineConfig (+ TrtllmConfig for --engine trtllm), the
disaggregation wrappers DisaggConfig, the image loader MediaConfig.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_gateway.config.disagg import DisaggConfig
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.config.mode import Mode
from trtllm_gateway.config.server import ServerConfig
from trtllm_gateway.config.serving import ServingConfig
from trtllm_gateway.config.trtllm import TrtllmConfig


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    server: ServerConfig
    serving: ServingConfig
    engine: EngineConfig
    trtllm: TrtllmConfig
    disagg: DisaggConfig
    media: MediaConfig

    @property
    def mode(self) -> Mode:
        """--mode: the engine runs in it, and the serving layer refuses what it does not serve."""
        return self.engine.mode
