"""The structs of vLLM's example KV event subscriber (array_like, with `medium`).

Transcribed from vllm-project/vllm examples/online_serving/kv_events_subscriber.py @
0ef0f42653bc5a0c7c44d26ce3a161e692b07a2c ("Types copied from vllm.distributed.kv_events"), the
reader vLLM's docs point users to: the first array_like structs (vllm_kv_events_array) with
`medium: Optional[str]` appended to BlockStored and BlockRemoved, the rest unchanged.
"""

from __future__ import annotations

from typing import Optional, Union

from tests.upstream import vllm_kv_events_array as first
from tests.upstream.vllm_kv_events_array import AllBlocksCleared, EventBatch


class BlockStored(first.BlockStored):
    medium: Optional[str]  # noqa: UP045 (as upstream wrote it)


class BlockRemoved(first.BlockRemoved):
    medium: Optional[str]  # noqa: UP045


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]  # noqa: UP007
