"""LoRA adapters served by name: --lora-modules NAME=PATH -> TensorRT-LLM LoRARequests.

As vLLM and trtllm-serve serve them: a request whose `model` is an adapter's name runs with
that adapter, /v1/models lists each one. TensorRT-LLM 1.2 takes
`generate_async(..., lora_request=LoRARequest(lora_name, lora_int_id, lora_path))`
(executor/request.py: the path must exist) and loads the adapter on first use; the flags layer
sets `lora_config` (config.engine_args), without which the PyTorch backend builds no LoRA
manager and ignores every lora_request (executor/base_worker.py).

That first use is `BaseWorker._load_lora_adapter`, called by `_enqueue_request` before its
`try`: an adapter that cannot load ends the executor worker (executor/worker.py `worker_main`
catches only RequestError), not just its request. So every adapter is checked here at start-up
as LoraManager.load_from_ckpt would read it: the directory, `adapter_config.json` (its rank
`r` at most `lora_config.max_lora_rank`, 64 by default), and the weights file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_gateway.config.engine_args import EngineArgsError
from trtllm_gateway.config.trtllm import TrtllmConfig, lora_module
from trtllm_gateway.engine.protocol import InvalidRequestError

DEFAULT_MAX_LORA_RANK = 64  # lora_helper.py LoraConfig.max_lora_rank
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True, slots=True)
class LoraAdapters:
    """name -> (lora_int_id, path); ids start at 1 and follow the flag's order."""

    by_name: dict[str, tuple[int, str]]

    @classmethod
    def from_config(cls, trtllm: TrtllmConfig, args: Mapping[str, Any]) -> LoraAdapters:
        """The adapters, each checked (EngineArgsError, one line, naming the adapter)."""
        entries = [lora_module(entry) for entry in trtllm.lora_modules]
        lora_config = args.get("lora_config") or {}
        max_rank = int(lora_config.get("max_lora_rank") or DEFAULT_MAX_LORA_RANK)
        for name, path in entries:
            check_adapter(name, Path(path), max_rank)
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


def check_adapter(name: str, path: Path, max_rank: int) -> None:
    """Refuse an adapter TensorRT-LLM's worker would die loading."""
    where = f"--lora-modules {name}={path}"
    config_path = path / "adapter_config.json"
    if not path.is_dir():
        raise EngineArgsError(f"{where}: not a directory")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise EngineArgsError(f"{where}: cannot read adapter_config.json: {exc}") from None
    rank = config.get("r") if isinstance(config, dict) else None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise EngineArgsError(f"{where}: adapter_config.json has no rank `r`")
    if rank > max_rank:
        raise EngineArgsError(
            f"{where}: rank {rank} exceeds lora_config.max_lora_rank {max_rank} "
            "(raise max_lora_rank in --extra-engine-args)"
        )
    if not any((path / weights).is_file() for weights in WEIGHT_FILES):
        raise EngineArgsError(f"{where}: no {' or '.join(WEIGHT_FILES)}")
