"""e2e fixtures: one real gateway process on the real default model, shared by the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.ops_client import INTERNAL_KEY
from tests.e2e.server import Server
from trtllm_gateway.engine.logits.load import TEST_PROCESSOR

pytestmark = pytest.mark.e2e


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-logs")


@pytest.fixture(scope="session")
def server(log_dir: Path) -> Iterator[Server]:
    """The built-in engine on SmolLM2 (default flags, a small KV pool to keep memory low), with
    the seeds' test logits processor for the requests whose vllm_xargs select it."""
    args = ["--num-kv-blocks", "512", "--internal-api-key", INTERNAL_KEY]
    srv = Server(args=[*args, "--logits-processor", TEST_PROCESSOR])
    srv.start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()
