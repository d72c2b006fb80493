"""--api-server-count auto (app/api_server_count.py): how many API servers a host runs."""

from __future__ import annotations

import pytest

from tests.configs import resolve_args
from trtllm_gateway.app.api_server_count import api_server_count, resolve_api_servers


@pytest.mark.parametrize(
    ("flags", "cores", "gpu", "count"),
    [
        ([], 16, True, 8),  # a 16-core GPU host
        ([], 64, True, 8),  # at most MAX_AUTO
        ([], 9, True, 4),
        ([], 8, True, 4),
        ([], 7, True, 1),  # fewer than MIN_CORES
        ([], 2, True, 1),  # CI's machine size
        ([], 16, False, 1),  # --device auto on a host without a GPU: the CPU engine
        (["--device", "cuda:1"], 16, None, 8),  # asked for a GPU: no driver query
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
