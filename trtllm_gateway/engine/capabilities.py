"""Engine capabilities: what the app reads from an engine, and what only some engines can do.

EngineExtras is read once the engine has started (every engine has it). The rest are checked with
isinstance where they are used: KvHandoff by the sibling KV endpoints, AbortSettling by the
remote prefill wrapper, KvEventSource by the KV event stream and its ZMQ publisher,
ImageEncoding by the sibling encode endpoint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from trtllm_gateway.engine.kv_events.log import KvEventLog
from trtllm_gateway.engine.kv_region import KvRegion
from trtllm_gateway.engine.stats import KvRoutingStats, RemotePrefillStats


@dataclass(frozen=True, slots=True)
class EngineExtras:
    """What the app reads from an engine besides serving it, complete once start() returned.

    Declared as one protocol member rather than fetched with getattr: a wrapper that forwards
    `extras` (RemotePrefillEngine) forwards every field, present and future, and mypy sees them.
    The stats are live objects that the engine keeps counting into; /metrics reads them.
    """

    tokenizer_dir: Path | None = None  # the model directory the engine resolved
    remote_prefill: RemotePrefillStats | None = None  # decode instances with --prefill-url
    kv_routing: KvRoutingStats | None = None  # --kv-routing over several prefill siblings
    remote_encode: Counter[str] | None = None  # --encode-url on a vision model: by outcome


@runtime_checkable
class KvHandoff(Protocol):
    """Engines whose context phase leaves KV for a sibling to pull over HTTP (the built-in one).

    TensorRT-LLM moves KV itself (cache transceiver), so its adapter does not implement this.
    """

    async def pull_kv(self, ctx_request_id: str) -> bytes:
        """The held prompt KV of a finished prefill as a kv_wire blob; frees the blocks."""
        ...

    async def stage_kv(self, ctx_request_id: str) -> KvRegion:
        """Where a finished prefill's KV is staged (protocol v2); held until release_kv."""
        ...

    def kv_view(self, region: KvRegion) -> memoryview:
        """A region of this engine's shared-memory arena, in place. Raises KvRegionError."""
        ...

    def kv_arena(self, name: str) -> memoryview:
        """This engine's whole shared-memory staging arena of that name (NIXL registers it).
        Raises KvRegionError."""
        ...

    def release_kv(self, ctx_request_id: str) -> None:
        """Free held or staged KV (pulled, copied, or given up); idempotent."""

    def renew_kv(self, ctx_request_id: str) -> None:
        """Hold the KV another hand-off timeout from now (the decode side still waits to pull
        it); unknown or already pulled ids are a no-op."""

    def cached_prefix_tokens(self, prompt_token_ids: tuple[int, ...]) -> int:
        """Prompt tokens the local prefix cache already holds (conditional disaggregation)."""
        ...


@runtime_checkable
class AbortSettling(Protocol):
    """Engines that say when an aborted request's core is past it (the built-in core's client).

    A decode request aborted before its first event may still be copying its KV from a region
    (the API server's receive arena, a same-host sibling's staged region): that region is freed
    only then, or a new hand-off written into it could reach the copy and, were the abort to
    come after the copy, the prefix cache.
    """

    def when_settled(self, request_id: str, fn: Callable[[], None]) -> None:
        """Call fn once the core has sent its last word on request_id; at once if nothing is
        outstanding."""


@runtime_checkable
class KvEventSource(Protocol):
    """Engines that publish KV-cache events for KV-aware routers: the built-in one always,
    TensorRT-LLM with --enable-kv-events. Read by /internal/v1/kv-events and --kv-events-zmq."""

    kv_event_log: KvEventLog


@runtime_checkable
class ImageEncoding(Protocol):
    """An engine that answers sibling encode requests (--mode encode)."""

    async def encode_images(self, body: bytes) -> list[bytes]:
        """A body of "pixels" frames -> one "embeds" frame per image, in order.

        Raises InvalidRequestError for a malformed body.
        """
        ...
