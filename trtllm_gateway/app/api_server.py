"""One API server of --api-server-count N (`python -m trtllm_gateway.app.api_server`), started by
the supervisor (app/supervisor.py).

Its spec (the configuration, its index, the listening socket's descriptor, where to reach the
shared engine core, the shared admission counters' file) comes down stdin, pickled and
length-prefixed, as the engine core's does (engine/transport/process.py). The listening socket is
inherited, so every server accepts on the one port and the kernel gives each connection to one of
them. It runs the single-process gateway's app and GatewayServer over a CoreClient attached to the
shared core, and exits once the supervisor is gone (never an orphan).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
import sys
from dataclasses import dataclass
from types import FrameType
from typing import IO, cast

import uvicorn

from trtllm_gateway.app.drain import Drain
from trtllm_gateway.app.main import create_app
from trtllm_gateway.app.server import GatewayServer, uvicorn_config
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.engine.factory import create_engine
from trtllm_gateway.engine.transport.attach import Attachment
from trtllm_gateway.web.logs import configure_logging
from trtllm_gateway.web.shared_counts import SharedCounts

logger = logging.getLogger("trtllm_gateway.app.api_server")  # also when run as __main__

_LEN = struct.Struct("!I")


@dataclass(frozen=True, slots=True)
class ApiServerSpec:
    config: GatewayConfig
    index: int
    fd: int  # the listening socket, inherited
    attach: Attachment
    counts_path: str  # SharedCounts

    @property
    def name(self) -> str:
        return f"api-server-{self.index}"

    def send(self, stdin: IO[bytes]) -> None:
        payload = pickle.dumps(self)
        stdin.write(_LEN.pack(len(payload)) + payload)
        stdin.flush()


class ApiServer(GatewayServer):
    """GatewayServer that also exits once its supervisor is gone (it has been reparented)."""

    def __init__(
        self, config: uvicorn.Config, drain: Drain, startup_timeout: float, supervisor: int
    ) -> None:
        super().__init__(config, drain, startup_timeout)
        self.supervisor = supervisor

    async def on_tick(self, counter: int) -> bool:
        if not self.should_exit and os.getppid() != self.supervisor:
            # The core goes with the supervisor (its lifeline): nothing is left to drain.
            logger.error("the supervisor is gone; the API server exits")
            self.should_exit = self.force_exit = True
        return await super().on_tick(counter)


def _read_spec(stdin: IO[bytes]) -> ApiServerSpec:
    (size,) = _LEN.unpack(stdin.read(_LEN.size))
    # Unpickled as trtllm_gateway.app.api_server's class, not this __main__ copy's: no isinstance.
    return cast(ApiServerSpec, pickle.loads(stdin.read(size)))


def _stop_before_serving(sig: int, frame: FrameType | None) -> None:
    # Until uvicorn installs its own handlers (the drain) and after it restores this one, a
    # SIGTERM from the supervisor ends the process quietly, with status 0 rather than -15.
    raise SystemExit(0)


def main() -> int:
    signal.signal(signal.SIGTERM, _stop_before_serving)
    supervisor = os.getppid()
    spec = _read_spec(sys.stdin.buffer)
    server = spec.config.server
    configure_logging(server.log_level, server.log_format, spec.name)
    try:
        app = create_app(
            spec.config, create_engine(spec.config, spec.attach), SharedCounts(spec.counts_path)
        )
    except (OSError, ValueError) as exc:  # an unreadable --api-key-file, a bad OTLP endpoint
        logger.error("%s", exc)
        return 2
    sock = socket.socket(fileno=spec.fd)
    logger.info("%s (pid %d) serving", spec.name, os.getpid())
    gateway = ApiServer(
        uvicorn_config(app, server), app.state.drain, server.startup_timeout, supervisor
    )
    gateway.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
