"""GatewayServer: uvicorn's Server with a drain before its shutdown, and exit status 0 on SIGTERM.

uvicorn on its own stops accepting connections at the first SIGTERM, cancels whatever outlives
timeout_graceful_shutdown (cutting streams without [DONE]) and re-raises the signal at exit. Here
the first SIGTERM/SIGINT runs app.drain.Drain while the socket stays open (so /health says 503
and new requests get 503), then lets uvicorn shut down what is left; a second signal forces exit.
"""

from __future__ import annotations

import asyncio
from types import FrameType

import uvicorn

from app.drain import Drain


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it and the exit status
        # would be -SIGTERM instead of 0.
        if self.drain.requested:
            self.should_exit = True
            self.force_exit = True
            return
        self.drain.begin()

    async def on_tick(self, counter: int) -> bool:
        if self.drain.requested and self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain(), name="drain")
        return await super().on_tick(counter)

    async def _drain(self) -> None:
        try:
            await self.drain.run()
        finally:
            self.should_exit = True
