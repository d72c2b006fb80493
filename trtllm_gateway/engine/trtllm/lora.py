"""LoRA adapters served by name: --lora-modules NAME=PATH -> TensorRT-LLM LoRARequests.

As vLLM and trtllm-serve serve them: a request whose `model` is an adapter's name runs with
that adapter, /v1/models lists each one. TensorRT-LLM 1.2 takes
`generate_async(..., lora_request=LoRARequest(lora_name, lora_int_id, lora_path))`
(executor/request.py: the path must exist) and loads the adapter on first use; the flags layer
sets `lora_config` (config.engine_args), without which the PyTorch backend builds no LoRA
manager and ignores every lora_request (executor/base_worker.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_gateway.config.trtllm import TrtllmConfig, lora_module
from trtllm_gateway.engine.protocol import InvalidRequestError


@dataclass(frozen=True, slots=True)
class LoraAdapters:
    """name -> (lora_int_id, path); ids start at 1 and follow the flag's order."""

    by_name: dict[str, tuple[int, str]]

    @classmethod
    def from_config(cls, trtllm: TrtllmConfig) -> LoraAdapters:
        entries = [lora_module(entry) for entry in trtllm.lora_modules]
        return cls({name: (i, path) for i, (name, path) in enumerate(entries, 1)})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.by_name)

    def request(self, llmapi: Any, name: str | None) -> Any:
        """The LoRARequest for `name`, None for the base model; a 400 for an unknown name."""
        if name is None:
            return None
        if name not in self.by_name:
            raise InvalidRequestError(f"no LoRA adapter named {name!r}", param="model")
        lora_id, path = self.by_name[name]
        try:
            return llmapi.LoRARequest(name, lora_id, path)
        except ValueError as exc:  # the path is gone since start-up
            raise InvalidRequestError(f"LoRA adapter {name!r}: {exc}", param="model") from None
