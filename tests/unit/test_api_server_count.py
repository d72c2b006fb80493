"""--api-server-count auto (app/api_server_count.py) and the servers' listening sockets
(app/supervisor.py listeners: one socket a server in the port's SO_REUSEPORT group)."""

from __future__ import annotations

import errno
import socket

import pytest

from tests.configs import resolve_args
from trtllm_gateway.app.api_server_count import api_server_count, resolve_api_servers
from trtllm_gateway.app.supervisor import listeners


@pytest.mark.parametrize(
    ("flags", "cores", "gpu", "count"),
    [
        ([], 16, True, 4),  # a 16-core GPU host
        ([], 64, True, 4),  # at most MAX_AUTO
        ([], 8, True, 2),
        ([], 7, True, 1),
        ([], 2, True, 1),  # CI's machine size
        ([], 16, False, 1),  # --device auto on a host without a GPU: the CPU engine
        (["--device", "cuda:1"], 16, None, 4),  # asked for a GPU: no driver query
        (["--device", "cpu"], 16, True, 1),
        (["--engine", "trtllm"], 16, True, 1),
        (["--no-engine-process"], 16, True, 1),
        (["--mode", "encode"], 16, True, 1),
        (["--kv-events-zmq", "tcp://*:5557"], 16, True, 1),
        (["--api-server-count", "3"], 2, False, 3),  # given: as given
        (["--api-server-count", "1"], 64, True, 1),
    ],
)
def test_auto_count(flags: list[str], cores: int, gpu: bool | None, count: int) -> None:
    assert api_server_count(resolve_args(*flags), cores, gpu) == count


def test_resolve_keeps_the_rest_of_the_config() -> None:
    config = resolve_args("--device", "cpu", "--port", "8123")
    assert config.server.api_server_count is None
    resolved = resolve_api_servers(config)
    assert resolved.server.api_server_count == 1
    assert resolved.server.port == 8123 and resolved.engine == config.engine


def _accepted(sock: socket.socket) -> int:
    sock.setblocking(False)
    n = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def test_each_server_gets_its_own_socket_and_a_share_of_the_connections() -> None:
    socks = listeners("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1 and len({s.fileno() for s in socks}) == 3
        assert all(s.get_inheritable() for s in socks)
        port = ports.pop()
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
        counts = [_accepted(s) for s in socks]
        for c in clients:
            c.close()
        # By a hash of the client's port: 60 over 3 leave none empty (a shared socket's accepts
        # would all land wherever the caller accepts, here the first).
        assert sum(counts) == 60 and min(counts) > 0, counts
    finally:
        for s in socks:
            s.close()


def test_a_port_in_use_is_refused_even_by_another_reuseport_group() -> None:
    plain = socket.socket()
    plain.bind(("127.0.0.1", 0))
    plain.listen()
    group = listeners("127.0.0.1", 0, 2)
    try:
        for port in (plain.getsockname()[1], group[0].getsockname()[1]):
            with pytest.raises(OSError, match="in use") as err:
                listeners("127.0.0.1", port, 2)
            assert err.value.errno == errno.EADDRINUSE
    finally:
        plain.close()
        for s in group:
            s.close()
