"""Stand-in `tensorrt_llm.executor.base_worker`: what `BaseWorker._enqueue_request` checks, and
in which order relative to its `try`.

Upstream (NVIDIA/TensorRT-LLM tensorrt_llm/executor/base_worker.py, `BaseWorker._enqueue_request`,
1.2 window; the same order in the 1.0-era executor/worker.py `ExecutorBindingsWorker`):
1. with a LoRA manager (`lora_config` given) and a `lora_request`, `_load_lora_adapter` runs
   `LoraManager.load_from_ckpt([path], ...)`: it reads the HF adapter's `adapter_config.json`
   and weights; whatever that raises is raised as it is;
2. a disaggregated request asserts `kv_cache_transceiver is not None` ("kv_cache_transceiver is
   disabled, please set 'cache_transceiver_config: backend:<backend_type>` ..."), an
   AssertionError, not a ValueError;
3. with the overlap scheduler on (`disable_overlap_scheduler` false) and a transceiver, a
   context-only request raises ValueError("Context only requests are not supported in pytorch
   backend when overlap is enabled.");
4. only then `try:` builds the executor `tllm.Request` and enqueues it; anything raised there
   becomes `RequestError(str(e))`, which fails that request only.
Steps 1-3 are outside the `try`: `worker_main` (executor/worker.py) catches only RequestError,
so their exceptions end the worker (this package's executor/worker.py models that).

The LoRA rank check (the adapter's `r` against `lora_config.max_lora_rank`) happens in 1.2 when
the weights reach the PEFT cache; where exactly the source left unclear, so the harsher reading
is taken: it fails at load time, outside the `try`, like a missing file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.utils import RequestError

_NO_TRANSCEIVER = (
    "kv_cache_transceiver is disabled, please set 'cache_transceiver_config: "
    "backend:<backend_type>` in config file for disaggregated serving"
)
_OVERLAP = "Context only requests are not supported in pytorch backend when overlap is enabled."
_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass(slots=True)
class GenerationRequest:
    """executor/request.py GenerationRequest: what the LLM hands its executor."""

    request_id: int
    prompt_token_ids: list[int]
    lora_request: LoRARequest | None
    request_type: str | None  # DisaggregatedParams.request_type, None when not disaggregated


class BaseWorker:
    """The worker's request intake; `args` are the LLM's (a SimpleNamespace here)."""

    def __init__(self, args: Any) -> None:
        self._args = args
        self._loaded_loras: set[int] = set()

    def _load_lora_adapter(self, lora_request: LoRARequest) -> bool:
        """LoraManager.load_from_ckpt for an HF adapter: config, weights, rank."""
        if lora_request.adapter_id in self._loaded_loras:
            return False
        path = lora_request.path
        config_path = os.path.join(path, "adapter_config.json")
        with open(config_path) as f:  # FileNotFoundError for a directory that is no adapter
            config = json.load(f)
        if not any(os.path.isfile(os.path.join(path, name)) for name in _WEIGHTS):
            raise FileNotFoundError(f"no adapter_model.safetensors or .bin in {path}")
        rank = int(config["r"])
        max_rank = self._args.lora_config.max_lora_rank
        if rank > max_rank:
            raise ValueError(f"LoRA rank {rank} of {path} exceeds max_lora_rank {max_rank}")
        self._loaded_loras.add(lora_request.adapter_id)
        return True

    def _enqueue_request(self, request: GenerationRequest) -> int:
        if self._args.lora_config is not None and request.lora_request is not None:
            self._load_lora_adapter(request.lora_request)  # before the try: see the docstring
        transceiver = self._args.cache_transceiver_config is not None
        if request.request_type is not None:
            assert transceiver or request.request_type == "context_and_generation", _NO_TRANSCEIVER
        if (
            not self._args.disable_overlap_scheduler
            and transceiver
            and request.request_type == "context_only"
        ):
            raise ValueError(_OVERLAP)
        try:
            return request.request_id  # tllm.Request(...) and engine.enqueue_request
        except Exception as e:
            raise RequestError(str(e)) from e
