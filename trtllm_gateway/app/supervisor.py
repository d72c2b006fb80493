"""supervise(config): --api-server-count N, the serve process as the parent of one engine core
and N API server processes that all accept on its one port.

    supervisor   binds the port once; a run directory (/tmp/gateway-core-*) holds the core's
    │            sockets, prometheus_client's multiprocess files and the shared admission counts
    ├─ engine core        engine/transport/process.py, its stdin the supervisor's lifeline as before
    └─ api-server-0..N-1  app/api_server.py, each an app + GatewayServer over a CoreClient
                          attached to the core (engine/transport/attach.py,
                          engine/transport/pipes.py)

SIGTERM/SIGINT: forwarded to every server, which drains as a single gateway does (app/drain.py)
and then detaches from the core; the core stops after the last (a second signal is forwarded too:
the servers then force their exit). The servers lead process groups of their own, so a terminal's
Ctrl-C reaches them once, through here. A server or the core that exits on its own stops
everything: the status is the first failure's (3 the engine died, 4 startup timeout, else 1), and
0 after a drain. No process, socket or file outlives the supervisor: an orphaned core removes the
run directory, and a server whose supervisor is gone exits; a run directory of a process group
killed all at once is removed by the next gateway's start (engine/transport/run_dir.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from types import FrameType

from trtllm_gateway.app.api_server import ApiServerSpec
from trtllm_gateway.app.server import ENGINE_DIED_EXIT, STARTUP_TIMEOUT_EXIT
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.config.server import ServerConfig
from trtllm_gateway.engine.factory import launch_shared_core
from trtllm_gateway.engine.transport import run_dir
from trtllm_gateway.engine.transport.attach import Attachment, client_addresses
from trtllm_gateway.engine.transport.launch import Launcher
from trtllm_gateway.web.shared_counts import SharedCounts

logger = logging.getLogger(__name__)

POLL_S = 0.1
CORE_STOP_S = 10.0  # the core ends once every server detached; then it is killed
BACKLOG = 2048  # uvicorn's default


def supervise(config: GatewayConfig) -> int:
    try:
        sock = _bind(config.server)
    except OSError as exc:
        sys.stderr.write(f"trtllm-gateway serve: {exc}\n")
        return 1
    folder = run_dir.make()
    try:
        return Supervisor(config, sock, folder).run()
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def _bind(server: ServerConfig) -> socket.socket:
    """The one listening socket, bound as uvicorn binds its own (Config.bind_socket)."""
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((server.host, server.port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class Supervisor:
    def __init__(self, config: GatewayConfig, sock: socket.socket, folder: str) -> None:
        self.config = config
        self.sock = sock
        self.folder = folder
        self.servers: list[subprocess.Popen[bytes]] = []
        self.core: Launcher | None = None
        self._signals = 0

    def run(self) -> int:
        count = self.config.server.api_server_count
        assert count is not None  # decided before: app/api_server_count.py
        metrics_dir = os.path.join(self.folder, "metrics")
        os.mkdir(metrics_dir)
        counts = os.path.join(self.folder, "admission")
        SharedCounts.create(counts, count)
        addresses = client_addresses(self.folder, count)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.core = launch_shared_core(self.config, addresses)
        assert self.core.pid is not None
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
        for index in range(count):
            attach = Attachment(addresses[index], self.core.pid)
            spec = ApiServerSpec(self.config, index, self.sock.fileno(), attach, counts)
            self.servers.append(self._spawn(spec, env))
        host, port = self.sock.getsockname()[:2]
        pids = ", ".join(str(p.pid) for p in self.servers)
        logger.info(
            "%d API servers (pids %s) on http://%s:%d, one engine core (pid %d)",
            count,
            pids,
            host,
            port,
            self.core.pid,
        )
        try:
            status = self._watch()
        finally:
            self._stop_servers()
        self._stop_core(kill=status != 0)
        logger.info("stopped (status %d)", status)
        return status

    def _spawn(self, spec: ApiServerSpec, env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trtllm_gateway.app.api_server"],
            stdin=subprocess.PIPE,
            pass_fds=(spec.fd,),
            env=env,
            process_group=0,  # Ctrl-C reaches it once, forwarded from here
        )
        assert proc.stdin is not None
        spec.send(proc.stdin)
        proc.stdin.close()
        return proc

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1  # forwarded by the watch loop, outside the handler

    def _watch(self) -> int:
        """Until every server has exited: forward signals, stop all on any exit; the status."""
        assert self.core is not None
        status, stopping, forwarded = 0, False, 0
        exited: set[int] = set()
        while len(exited) < len(self.servers):
            time.sleep(POLL_S)
            while forwarded < self._signals:
                forwarded += 1
                if not stopping:
                    logger.info("draining the API servers")
                stopping = True
                self._terminate()
            for index, proc in enumerate(self.servers):
                code = proc.poll()
                if code is None or index in exited:
                    continue
                exited.add(index)
                if code != 0:
                    logger.error("api-server-%d exited with status %d", index, code)
                    status = status or _status(code)
                if not stopping:
                    logger.error("api-server-%d exited: stopping the others", index)
                    status = status or 1
                    stopping = True
                    self._terminate()
            if not stopping and self.core.exitcode is not None:
                logger.error("the engine core exited (code %s): stopping", self.core.exitcode)
                status, stopping = ENGINE_DIED_EXIT, True
                self._terminate()
        return status

    def _terminate(self) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def _stop_servers(self) -> None:
        """Only after the watch failed: no server is left behind."""
        for proc in self.servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def _stop_core(self, kill: bool) -> None:
        core = self.core
        if core is None:
            return
        if kill or not core.join(CORE_STOP_S):
            if not kill:
                logger.warning("the engine core did not stop after its last client; killing it")
            core.kill()
        else:
            logger.info("engine core stopped (code %s)", core.exitcode)


def _status(code: int) -> int:
    return code if code in (ENGINE_DIED_EXIT, STARTUP_TIMEOUT_EXIT) else 1
