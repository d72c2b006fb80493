"""AttachedCore: the Launcher of an API server whose engine core another process started and owns.

With --api-server-count N the supervisor (app/supervisor.py) starts one core for N API servers;
each server's CoreClient binds the addresses the supervisor chose for it and talks to that core
as if it had launched it. start() launches nothing; the sentinel is a pidfd of the core (Linux
opens one for any process, not only a child), so a core that dies still fails every open stream
at once; join and kill leave the process to its owner, who joins it after every client stopped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import zmq

from trtllm_gateway.engine.transport.loop import Addresses


@dataclass(frozen=True, slots=True)
class Attachment:
    """What an API server needs to reach the shared core: its own addresses, the core's pid."""

    addresses: Addresses
    core_pid: int


def client_addresses(folder: str, count: int) -> tuple[Addresses, ...]:
    """Each client's ipc:// addresses in one directory (the core's run directory, run_dir.py, which
    an orphaned core removes)."""
    return tuple(
        Addresses(f"ipc://{folder}/in-{i}", f"ipc://{folder}/out-{i}", f"ipc://{folder}/probe-{i}")
        for i in range(count)
    )


class AttachedCore:
    transport = "ipc"

    def __init__(self, core_pid: int | None) -> None:
        """core_pid: the running core's process (None: nothing to watch, e.g. a thread)."""
        self.core_pid = core_pid
        self._pidfd: int | None = None

    def start(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses) -> None:
        if self.core_pid is not None:
            try:
                self._pidfd = os.pidfd_open(self.core_pid)
            except ProcessLookupError:
                self._pidfd = None  # gone already: the handshake never comes (startup timeout)

    @property
    def sentinel(self) -> int | None:
        return self._pidfd

    @property
    def exitcode(self) -> int | None:
        return None  # not our child: its owner reaps it and knows the code

    @property
    def pid(self) -> int | None:
        return self.core_pid

    def join(self, timeout: float) -> bool:
        self._release()
        return True

    def kill(self) -> None:
        self._release()

    def _release(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
