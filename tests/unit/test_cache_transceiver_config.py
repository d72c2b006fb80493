"""cache_transceiver_config as TensorRT-LLM 1.2 takes it (issue 41 item 6): the stand-in
(tests/standin/tensorrt_llm/llmapi/llm_args.py) and the gateway's fallback schema
(trtllm_gateway/config/trtllm_schema.py) accept and refuse the same values.

Upstream: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, class CacheTransceiverConfig
(a StrictBaseModel: unknown keys refused): `backend: Optional[Literal["DEFAULT", "UCX", "NIXL",
"MOONCAKE", "MPI"]]`, `max_tokens_in_buffer: Optional[int]` (no bound), `kv_transfer_timeout_ms`
(> 0), `kv_transfer_sender_future_timeout_ms`. The names are upper case ("ucx" is refused; the
older lower-case Literal is pre-1.0), and `UCX_TCP` is a C++ enum value, not a config value.
`transceiver_runtime` appears in later sources than the 1.2 window: refused, the harsher reading.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.standin import ensure_on_path
from trtllm_gateway.config import trtllm_schema

ACCEPTED: list[dict[str, Any]] = [
    {},
    {"backend": None},
    *({"backend": b} for b in ("DEFAULT", "UCX", "NIXL", "MPI", "MOONCAKE")),
    {"backend": "UCX", "max_tokens_in_buffer": 8192},
    {"max_tokens_in_buffer": 0},  # no bound upstream: the transceiver fails later, not pydantic
    {"kv_transfer_timeout_ms": 30000},
    {"kv_transfer_sender_future_timeout_ms": 1000},
]
REFUSED: list[dict[str, Any]] = [
    {"backend": "ucx"},
    {"backend": "UCX_TCP"},
    {"backend": "LIBFABRIC"},  # a NIXL backend (TRTLLM_NIXL_KVCACHE_BACKEND), not a transceiver
    {"kv_transfer_timeout_ms": 0},
    {"max_num_tokens": 8192},  # the field's name before max_tokens_in_buffer
    {"transceiver_runtime": "CPP"},
]


def _standin() -> type:
    ensure_on_path()
    from tensorrt_llm.llmapi import CacheTransceiverConfig

    return CacheTransceiverConfig  # type: ignore[no-any-return]


@pytest.mark.parametrize("value", ACCEPTED, ids=str)
def test_both_accept_what_1_2_accepts(value: dict[str, Any]) -> None:
    _standin()(**value)
    trtllm_schema.CacheTransceiverConfig(**value)


@pytest.mark.parametrize("value", REFUSED, ids=str)
def test_both_refuse_what_1_2_refuses(value: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _standin()(**value)
    with pytest.raises(ValidationError):
        trtllm_schema.CacheTransceiverConfig(**value)
