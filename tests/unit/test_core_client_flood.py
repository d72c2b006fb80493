"""CoreClient under a core that sends batches as fast as it can (issue 24): the reader yields.

A socket with a message queued completes recv without suspending, so a reader that never awaits
anything else kept the event loop to itself while the core flooded it (the gateway's /health
stopped answering). The flood here is a core whose every step changes its health snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.unit.test_core_client import ScriptedCore
from trtllm_gateway.engine.protocol import EngineHealth
from trtllm_gateway.engine.transport import messages as m
from trtllm_gateway.engine.transport.client import CoreClient
from trtllm_gateway.engine.transport.inproc import ThreadLauncher


class FloodCore(ScriptedCore):
    """After an Abort of "flood" arrives... never: it floods from load to Stop."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def has_work(self) -> bool:
        return not self.stopping

    def step(self) -> None:
        self.steps += 1

    def batch(self) -> m.OutputBatch:
        return m.OutputBatch([], [], EngineHealth(state="ready", preemptions=self.steps))


@pytest.fixture
async def flooded() -> AsyncIterator[CoreClient]:
    c = CoreClient(ThreadLauncher(FloodCore), "flood", 16)
    await c.start()
    yield c
    await c.stop()


async def test_a_flooding_core_leaves_the_event_loop_to_others(flooded: CoreClient) -> None:
    await asyncio.sleep(0.2)  # the flood is on
    waits = []
    for _ in range(20):
        t0 = time.monotonic()
        await asyncio.sleep(0.001)
        waits.append(time.monotonic() - t0)
    assert max(waits) < 0.5, waits
    assert flooded.health().preemptions > 100  # the reader kept up with the flood meanwhile
