"""Settings: the CLI and GATEWAY_* environment as one flat set of flags, split into its parts.

Flags > GATEWAY_* environment > defaults, parsed once (app/cli.py, `config show`). Settings is
every part at once (multiple inheritance), so the flag names, their kebab case and the env names
stay flat; `parts()` hands each subsystem only its own part (config/gateway.py). Only the
composition root and this package import it (an import-linter contract): everything else takes
the part it reads.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trtllm_gateway.config.api_servers import unshareable
from trtllm_gateway.config.disagg import DisaggConfig
from trtllm_gateway.config.engine import DEFAULT_MODEL, EngineConfig
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.config.server import ServerConfig
from trtllm_gateway.config.serving import ServingConfig
from trtllm_gateway.config.trtllm import TrtllmConfig, lora_module

__all__ = ["DEFAULT_MODEL", "Settings"]

Part = TypeVar("Part", bound=BaseModel)

# The parts in the order their flags appear (--help, docs/flags.md's tables).
PARTS: tuple[type[BaseModel], ...] = (
    ServerConfig,
    ServingConfig,
    EngineConfig,
    TrtllmConfig,
    DisaggConfig,
    MediaConfig,
)


# The bases are PARTS reversed: pydantic collects fields over the reversed MRO, so the server's
# flags come first in --help, as they did before the split.
class Settings(
    MediaConfig,
    DisaggConfig,
    TrtllmConfig,
    EngineConfig,
    ServingConfig,
    ServerConfig,
    BaseSettings,
):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        frozen=True,
        extra="forbid",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="trtllm-gateway serve",
        cli_exit_on_error=True,
    )

    @model_validator(mode="after")
    def _check_lora_modules(self) -> Settings:
        if not self.lora_modules:
            return self
        if self.engine != "trtllm" or self.mode != "aggregated":
            # The built-in engine has no LoRA; a prefill sibling would need the same adapters
            # and the sibling protocol does not name one.
            raise ValueError("--lora-modules needs --engine trtllm in --mode aggregated")
        names = [lora_module(entry)[0] for entry in self.lora_modules]
        if len(set(names)) != len(names):
            raise ValueError("--lora-modules: each adapter name must be unique")
        return self

    @model_validator(mode="after")
    def _check_api_server_count(self) -> Settings:
        if self.api_server_count is None or self.api_server_count == 1:
            return self  # auto picks 1 where servers cannot share (app/api_server_count.py)
        reason = unshareable(self, self)
        if reason is not None:
            raise ValueError(f"--api-server-count > 1 {reason}")
        return self

    def part(self, cls: type[Part]) -> Part:
        """One part from the fields given (flags, env, keywords): the rest keep the part's own
        defaults, and its model_fields_set still says what was given (the TensorRT-LLM args
        send some flags only if given)."""
        given = {
            name: getattr(self, name) for name in cls.model_fields if name in self.model_fields_set
        }
        return cls.model_validate(given)

    def parts(self) -> GatewayConfig:
        return GatewayConfig(
            server=self.part(ServerConfig),
            serving=self.part(ServingConfig),
            engine=self.part(EngineConfig),
            trtllm=self.part(TrtllmConfig),
            disagg=self.part(DisaggConfig),
            media=self.part(MediaConfig),
        )
