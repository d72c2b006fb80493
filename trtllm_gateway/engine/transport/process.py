"""ProcessLauncher: the core loop in its own process (`python -m engine.transport.process`), which
owns the torch threads.

A plain subprocess rather than multiprocessing: no resource-tracker process to outlive the
gateway, no re-import of the gateway's __main__. The core factory (and the log level) go down the
child's stdin (pickled, length-prefixed); stdin then stays open as the parent's lifeline: it reads
EOF when the gateway is gone, however it died, and the core exits (never an orphan). The gateway
watches a pidfd of the child, readable the moment it exits.

prestart(modules) starts the next core process early, before the gateway has imported its app:
the child imports the core's modules (torch and the engine: 2-4 s on two cores) while the parent
imports and builds its own, and then waits for its factory; launch() hands the factory to it
instead of starting a process of its own. One that is never used is killed by discard_warm() (at
the latest at the gateway's exit), or reads EOF and exits when the gateway died first.

The child ignores SIGINT/SIGTERM: the gateway drains and then sends Stop, so a signal sent to the
whole process group (a terminal's Ctrl-C, an init) cannot cut streams mid-drain. It also leads a
process group of its own, so kill() ends what it started too (a first start's CPU-kernel
compilers would otherwise go on as orphans after a --startup-timeout).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
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
_MODULE = "trtllm_gateway.engine.transport.process"
_WARM = "--import"  # the child's argument: modules to import before its factory arrives
_warm: list[subprocess.Popen[bytes]] = []  # a prestarted core process, not yet launched


def _spawn(modules: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    extra = [_WARM, ",".join(modules)] if modules else []
    return subprocess.Popen(
        [sys.executable, "-m", _MODULE, *extra], stdin=subprocess.PIPE, process_group=0
    )


def prestart(modules: tuple[str, ...]) -> None:
    """Start the next core process now; it imports `modules` while this process goes on."""
    if not _warm:
        _warm.append(_spawn(modules))
        atexit.register(discard_warm)


def discard_warm() -> None:
    """End a prestarted core process that no launch took: it holds nothing but its imports."""
    while _warm:
        proc = _warm.pop()
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        proc.kill()
        proc.wait()


def _take_warm() -> subprocess.Popen[bytes] | None:
    """The prestarted process, when there is one and it is alive (else a fresh one is started)."""
    if _warm and _warm[-1].poll() is None:
        return _warm.pop()
    discard_warm()
    return None


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
        self._proc = _take_warm() or _spawn()
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
    if sys.argv[1:2] == [_WARM]:  # prestarted: the core's imports before its factory arrives
        for name in sys.argv[2].split(","):
            with contextlib.suppress(Exception):  # a failing import fails again, reported, below
                importlib.import_module(name)
    head = stdin.read(_LEN.size)
    if len(head) < _LEN.size:
        return 0  # a prestarted process no launch took
    (size,) = _LEN.unpack(head)
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
