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
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from trtllm_gateway.app.drain import Drain
from trtllm_gateway.app.http_protocol import bounded_protocol
from trtllm_gateway.config.server import ServerConfig

logger = logging.getLogger(__name__)

FORCED_SHUTDOWN_S = 5.0
ENGINE_DIED_EXIT = 3
STARTUP_TIMEOUT_EXIT = 4
STARTUP_REPORT_S = 30.0
DRAIN_TAIL_S = 5


def uvicorn_config(app: FastAPI, server: ServerConfig) -> uvicorn.Config:
    """uvicorn's settings for the gateway's app (one process, or each API server's)."""
    return uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=server.log_level,
        log_config=None,  # uvicorn's loggers go through ours (request_id, json)
        access_log=False,  # RequestContextMiddleware logs one line per request
        # The drain already waited --shutdown-timeout; this only bounds closing what is left.
        timeout_graceful_shutdown=DRAIN_TAIL_S,
        # httptools (C) for its per-chunk cost, with the request head bounded as h11 bounds it
        # (app/http_protocol.py: httptools alone parsed a 128 MB header for 39 s before auth).
        http=bounded_protocol(server.max_header_bytes),
    )


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain, startup_timeout: float = 0) -> None:
        super().__init__(config)
        self.drain = drain
        self._drain_task: asyncio.Task[None] | None = None
        self.engine_died = False
        self.startup_timeout = startup_timeout
        self.startup_failed = False
        self._started = time.monotonic()
        self._next_report = STARTUP_REPORT_S
        self._starting = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it and the exit status
        # would be -SIGTERM instead of 0.
        if self.drain.requested:
            self.should_exit = True
            self.force_exit = True
            return
        self.drain.begin()

    async def on_tick(self, counter: int) -> bool:
        if self._starting:
            self._watch_startup()
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
        if self.startup_failed:
            raise SystemExit(STARTUP_TIMEOUT_EXIT)

    def _watch_startup(self) -> None:
        """While the engine loads: say what it waits on every STARTUP_REPORT_S, and exit after
        --startup-timeout so an orchestrator restarts a process that would never be ready."""
        state = self.drain.state
        health = state.health() if state is not None else None
        if health is not None and health.state != "loading":
            self._starting = False  # ready, or a start that failed and says why in /health
            return
        waited = time.monotonic() - self._started
        doing = (health.detail if health is not None else "") or "starting the engine"
        if self.startup_timeout and waited > self.startup_timeout:
            logger.error(
                "not ready after %.0f s (--startup-timeout %.0f s), still %s; exiting",
                waited,
                self.startup_timeout,
                doing,
            )
            self._starting = False
            self.startup_failed = True
            self.should_exit = True
        elif waited >= self._next_report:
            logger.warning("not ready after %.0f s: %s", waited, doing)
            self._next_report += STARTUP_REPORT_S

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
