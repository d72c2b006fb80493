"""Graceful drain on SIGTERM/SIGINT: refuse new work at once, let in-flight requests finish for
--shutdown-timeout seconds, then stop the engine, which ends what remains with finish_reason
"abort" (streams still get their finish chunk and [DONE]).

    signal ─▶ begin()        /health 503, new requests 503 (admission closed), socket still open
           ─▶ run()          wait for in-flight == 0, up to the timeout; else stop the engine and
                             give the aborted streams ABORT_GRACE_S to flush; with
                             --api-server-count N, then wait (within the timeout) for every
                             server's in-flight == 0, still answering 503
           ─▶ uvicorn exits  closes idle connections, lifespan shutdown (engine already stopped)

The servers of --api-server-count N accept on one shared socket: a server that drained first and
exited would close connections the kernel had just given it (a client's /health reset instead of
answered 503), so each stays up until all are idle.
"""

from __future__ import annotations

import asyncio
import logging
import time

from trtllm_gateway.web.admission import AdmissionControl
from trtllm_gateway.web.state import State

logger = logging.getLogger(__name__)

ABORT_GRACE_S = 3.0
OTHERS_POLL_S = 0.05


class Drain:
    """One app's drain; the lifespan binds its State, the server (app/server.py) triggers it."""

    def __init__(self, admission: AdmissionControl, timeout_s: float) -> None:
        self.admission = admission
        self.timeout_s = timeout_s
        self.state: State | None = None
        self.requested = False

    def bind(self, state: State) -> None:
        self.state = state
        state.draining = state.draining or self.requested

    def begin(self) -> None:
        """Flip /health and admission to 503. Only sets flags: safe inside a signal handler."""
        self.requested = True
        self.admission.close()
        if self.state is not None:
            self.state.draining = True

    async def run(self) -> None:
        self.begin()
        deadline = time.monotonic() + self.timeout_s
        in_flight = self.admission.in_flight
        logger.info("draining: %d requests in flight, up to %.1fs", in_flight, self.timeout_s)
        if await self.admission.wait_idle(self.timeout_s):
            logger.info("drained: every in-flight request finished")
            await self._wait_for_other_servers(deadline)
            return
        logger.warning("shutdown timeout: aborting %d requests in flight", self.admission.in_flight)
        if self.state is not None:
            await self.state.stop_engine()
        if not await self.admission.wait_idle(ABORT_GRACE_S):
            logger.warning("%d requests still open after abort", self.admission.in_flight)

    async def _wait_for_other_servers(self, deadline: float) -> None:
        """--api-server-count N: this server's requests are done; it keeps answering 503 until
        every server's are (SharedCounts), or the drain's timeout has passed."""
        shared = self.admission.shared
        if shared is None or shared.in_flight == 0:
            return
        logger.info("waiting for the other API servers' %d requests", shared.in_flight)
        while shared.in_flight > 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - another process
            await asyncio.sleep(OTHERS_POLL_S)
