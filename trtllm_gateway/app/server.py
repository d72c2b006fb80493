"""GatewayServer: uvicorn's Server with a drain before its shutdown, and exit status 0 on SIGTERM.

uvicorn on its own stops accepting connections at the first SIGTERM, cancels whatever outlives
timeout_graceful_shutdown (cutting streams without [DONE]) and re-raises the signal at exit. Here
the first SIGTERM/SIGINT runs app.drain.Drain while the socket stays open (so /health says 503
and new requests get 503), then lets uvicorn shut down what is left; a second signal forces exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from types import FrameType

import uvicorn

from trtllm_gateway.app.drain import Drain

logger = logging.getLogger(__name__)

FORCED_SHUTDOWN_S = 5.0
ENGINE_DIED_EXIT = 3


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._drain_task: asyncio.Task[None] | None = None
        self.engine_died = False

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
        if not self.engine_died and self._engine_dead():
            # An engine that died while serving (its process killed, a step that raised): exit
            # non-zero so an orchestrator restarts the instance; open streams already got their
            # error frame. A model that never loaded stays up with /health 503 and the reason.
            logger.error("the engine died; the server exits")
            self.engine_died = True
            self.should_exit = True
        return await super().on_tick(counter)

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        super().run(sockets)
        if self.engine_died:
            raise SystemExit(ENGINE_DIED_EXIT)

    def _engine_dead(self) -> bool:
        state = self.drain.state
        if state is None or state.start_error is not None or state.draining:
            return False
        return state.engine.health().state == "dead"

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the lifespan shutdown on a forced exit; the lifespan task would then
            # be cancelled as the loop closes, and starlette logs that CancelledError with a
            # traceback. A second SIGTERM is often the first one echoed (make, a shell or an
            # init passes it on to a process group that got it already): the engine still
            # stops, within a bound.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.lifespan.shutdown(), FORCED_SHUTDOWN_S)

    async def _drain(self) -> None:
        try:
            await self.drain.run()
        finally:
            self.should_exit = True
