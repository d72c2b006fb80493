"""ProcessLauncher: the core loop in its own process (`python -m engine.transport.process`), which
owns the torch threads.

A plain subprocess rather than multiprocessing: no resource-tracker process to outlive the
gateway, no re-import of the gateway's __main__. The core factory (and the log level) go down the
child's stdin (pickled, length-prefixed); stdin then stays open as the parent's lifeline: it reads
EOF when the gateway is gone, however it died, and the core exits (never an orphan). The gateway
watches a pidfd of the child, readable the moment it exits.

The child ignores SIGINT/SIGTERM: the gateway drains and then sends Stop, so a signal sent to the
whole process group (a terminal's Ctrl-C, an init) cannot cut streams mid-drain. It also leads a
process group of its own, so kill() ends what it started too (a first start's CPU-kernel
compilers would otherwise go on as orphans after a --startup-timeout).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys

import zmq

from trtllm_gateway.engine.transport.launch import CoreFactory
from trtllm_gateway.engine.transport.loop import Addresses, run_core

logger = logging.getLogger(__name__)

_LEN = struct.Struct("!I")


class ProcessLauncher:
    transport = "ipc"

    def __init__(self, factory: CoreFactory, log_level: str = "info") -> None:
        self.factory = factory
        self.log_level = log_level
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None

    def start(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses) -> None:
        self.launch(addrs)

    def launch(self, addrs: Addresses | tuple[Addresses, ...]) -> None:
        """Start the core for one client, or for each API server (--api-server-count)."""
        payload = pickle.dumps((self.factory, self.log_level, addrs))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "trtllm_gateway.engine.transport.process"],
            stdin=subprocess.PIPE,
            process_group=0,
        )
        self._pidfd = os.pidfd_open(self._proc.pid)
        assert self._proc.stdin is not None
        self._proc.stdin.write(_LEN.pack(len(payload)) + payload)
        self._proc.stdin.flush()  # stdin stays open: the child's lifeline
        logger.info("engine core process %d started", self._proc.pid)

    @property
    def sentinel(self) -> int | None:
        return self._pidfd

    @property
    def exitcode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def join(self, timeout: float) -> bool:
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        self._release()
        return True

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)  # the core and its compilers
            self._proc.wait(5.0)
        self._release()

    def _release(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stdin = sys.stdin.buffer
    (size,) = _LEN.unpack(stdin.read(_LEN.size))
    factory, log_level, addrs = pickle.loads(stdin.read(size))
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s engine-core %(levelname)s %(name)s: %(message)s",
    )
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    code = run_core(factory, ctx, addrs, stdin.fileno())
    ctx.term()
    return code


if __name__ == "__main__":
    sys.exit(main())
