"""Schema fuzzing (schemathesis) against the live /openapi.json of the real server: positive
examples only, a bounded number per operation, small max_tokens; no 5xx, and every response
matches what the schema documents (status-code checks are off: 400/404/503 are ours to give).

Driven through hypothesis directly rather than schemathesis' pytest plugin, which does not load
under this pytest.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)

from tests.e2e.ops_client import MODEL
from tests.e2e.server import Server

MAX_EXAMPLES = 20
PATHS = r"^/(v1/.*|health|version)$"
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]


def _bounded(body: Any) -> None:
    """Keep generations tiny and on the served model so the run stays fast."""
    if not isinstance(body, dict):
        return
    body["model"] = MODEL
    body["stream"] = False  # the schema documents JSON bodies, not event streams
    body["n"] = 1
    body["max_tokens"] = max(1, min(body.get("max_tokens") or 4, 4))
    body.pop("max_completion_tokens", None)


def test_openapi_fuzz(server: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    schema.config.generation.update(allow_x00=False)
    operations = [r.ok() for r in schema.include(path_regex=PATHS).get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"} <= paths
    t0 = time.monotonic()
    for operation in operations:

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(GenerationMode.POSITIVE))
        def fuzz(case: Any) -> None:
            _bounded(case.body)
            case.call_and_validate(checks=CHECKS, timeout=60)

        try:
            fuzz()
        except Exception as exc:
            pytest.fail(f"{operation.method.upper()} {operation.path}: {exc}\n{server.log()}")
    assert time.monotonic() - t0 < 240
