"""KvRoom: a decode instance's KV blocks promised to prompts whose context phase is remote.

Before a prompt goes to a prefill sibling, the decode side reserves the blocks its KV and first
tokens will take here: free blocks (the engine's latest health: total - active) less what other
remote prefills in flight already reserved. Without room it waits (a freed reservation or a
finished local request makes some) instead of asking a sibling to compute KV that would then
sit held there, under its lease, until this instance can take it. The reservation ends when the
engine admits the sequence (its first event) or the prompt goes local.

It is admission, not a pin: the engine does not know about it, and a local request may take the
blocks first; the engine's own scheduler then queues the import as it queues any prompt.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

from trtllm_gateway.engine.protocol import EngineHealth

_BLOCK = re.compile(r":bs(\d+)$")  # engine/builtin/loader.py's layout ends with the block size
POLL_S = 0.02  # how often a waiter re-reads the health snapshot (the core sends one per step)


def block_size_of(kv_layout: str) -> int | None:
    """The built-in engine's block size from its KV layout string; None for another engine."""
    m = _BLOCK.search(kv_layout)
    return int(m.group(1)) if m else None


class Reservation:
    """Blocks held for one prompt; `release()` is idempotent."""

    __slots__ = ("_room", "blocks")

    def __init__(self, room: KvRoom | None, blocks: int) -> None:
        self._room = room
        self.blocks = blocks

    def release(self) -> None:
        room, self._room = self._room, None
        if room is not None:
            room._release(self.blocks)


class KvRoom:
    """Event-loop only. health: the engine's latest snapshot (never waits for a step)."""

    def __init__(self, health: Callable[[], EngineHealth], block_size: int | None) -> None:
        self._health = health
        self.block_size = block_size
        self.reserved = 0
        self._freed = asyncio.Event()

    def blocks_for(self, tokens: int) -> int:
        assert self.block_size
        return -(-tokens // self.block_size)

    def free(self) -> int:
        h = self._health()
        return h.kv_total_blocks - h.kv_active_blocks - self.reserved

    def try_reserve(self, tokens: int) -> Reservation | None:
        """Room for `tokens` now, or None. An engine whose blocks are unknown (not the built-in
        one, or no snapshot yet) and a prompt larger than the whole cache get an empty
        reservation: there is nothing to wait for."""
        total = self._health().kv_total_blocks
        if not self.block_size or total <= 0:
            return Reservation(None, 0)
        blocks = self.blocks_for(tokens)
        if blocks > total:
            return Reservation(None, 0)
        if blocks > self.free():
            return None
        self.reserved += blocks
        return Reservation(self, blocks)

    async def reserve(self, tokens: int, wait_s: float) -> Reservation | None:
        """Room for `tokens`, waiting up to `wait_s` seconds for it; None if none came."""
        deadline = time.monotonic() + wait_s
        while (got := self.try_reserve(tokens)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._freed.clear()
            try:
                async with asyncio.timeout(min(POLL_S, left)):
                    await self._freed.wait()
            except TimeoutError:
                pass
        return got

    def _release(self, blocks: int) -> None:
        self.reserved -= blocks
        self._freed.set()
