"""Graceful drain on SIGTERM/SIGINT: refuse new work at once, let in-flight requests finish for
--shutdown-timeout seconds, then stop the engine, which ends what remains with finish_reason
"abort" (streams still get their finish chunk and [DONE]).

    signal ─▶ begin()        /health 503, new requests 503 (admission closed), socket still open
           ─▶ run()          wait for in-flight == 0, up to the timeout; else stop the engine and
                             give the aborted streams ABORT_GRACE_S to flush
           ─▶ uvicorn exits  closes idle connections, lifespan shutdown (engine already stopped)
"""

from __future__ import annotations

import logging

from trtllm_gateway.web.admission import AdmissionControl
from trtllm_gateway.web.state import State

logger = logging.getLogger(__name__)

ABORT_GRACE_S = 3.0


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
        in_flight = self.admission.in_flight
        logger.info("draining: %d requests in flight, up to %.1fs", in_flight, self.timeout_s)
        if await self.admission.wait_idle(self.timeout_s):
            logger.info("drained: every in-flight request finished")
            return
        logger.warning("shutdown timeout: aborting %d requests in flight", self.admission.in_flight)
        if self.state is not None:
            await self.state.stop_engine()
        if not await self.admission.wait_idle(ABORT_GRACE_S):
            logger.warning("%d requests still open after abort", self.admission.in_flight)
