"""API keys: 401 (OpenAI error shape) without the right key on /v1/*; /health, /metrics and
/version stay open; keys from flags, env and a file. The sibling and router endpoints (/internal/)
take only the internal key: 403 without one configured (the default), 401 for a client key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.ops_helpers import CHAT, serve
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings

KEYS = ["sk-one", "sk-two"]


async def test_missing_or_wrong_key_is_401(settings: Settings, fake_engine: FakeEngine) -> None:
    async with serve(settings, fake_engine, api_key=KEYS) as (_, client):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "sk-one"}):
            r = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            error = r.json()["error"]
            assert error["type"] == "AuthenticationError"
            assert error["code"] == "invalid_api_key"
            assert "sk-" not in error["message"]
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/openapi.json")).status_code == 401


async def test_right_key_passes(settings: Settings, fake_engine: FakeEngine) -> None:
    async with serve(settings, fake_engine, api_key=KEYS) as (_, client):
        for headers in (
            {"Authorization": "Bearer sk-one"},
            {"Authorization": "bearer sk-two"},
            {"X-Api-Key": "sk-two"},
        ):
            r = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 200, headers
            assert (await client.get("/v1/models", headers=headers)).status_code == 200


async def test_public_paths_stay_open(settings: Settings, fake_engine: FakeEngine) -> None:
    async with serve(settings, fake_engine, api_key=KEYS) as (_, client):
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/version")).status_code == 200
    async with serve(settings, fake_engine, api_key=KEYS, public_paths=["/health"]) as (_, client):
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 401


async def test_key_file(settings: Settings, fake_engine: FakeEngine, tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# ops keys\nsk-file\n\n")
    async with serve(settings, fake_engine, api_key_file=path) as (_, client):
        ok = {"Authorization": "Bearer sk-file"}
        assert (await client.get("/v1/models", headers=ok)).status_code == 200
        assert (await client.get("/v1/models")).status_code == 401


def test_keys_from_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEY", "k1, k2")
    assert [k.get_secret_value() for k in Settings().api_key] == ["k1", "k2"]
    flags = Settings(_cli_parse_args=["--api-key", "a", "--api-key", "b,c"])
    assert [k.get_secret_value() for k in flags.api_key] == ["a", "b", "c"]
    assert "a" not in repr(flags.api_key)  # SecretStr: never printed


async def test_no_keys_no_auth(settings: Settings, fake_engine: FakeEngine) -> None:
    async with serve(settings, fake_engine) as (_, client):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


INTERNAL_PATHS = [
    ("GET", "/internal/v1/info"),
    ("POST", "/internal/v1/prefill"),
    ("GET", "/internal/v1/kv/ctx-1"),
    ("DELETE", "/internal/v1/kv/ctx-1"),
    ("POST", "/internal/v1/encode"),
    ("GET", "/internal/v1/kv-events"),
    ("GET", "/internal/v1/load"),
]


@pytest.mark.parametrize("client_keys", [[], KEYS])
async def test_internal_endpoints_are_off_by_default(
    settings: Settings, fake_engine: FakeEngine, client_keys: list[str]
) -> None:
    """Issue 24: without --internal-api-key nobody reaches them, with or without a client key."""
    async with serve(settings, fake_engine, api_key=client_keys) as (_, client):
        for method, path in INTERNAL_PATHS:
            for headers in ({}, {"Authorization": "Bearer sk-one"}):
                r = await client.request(method, path, headers=headers)
                assert r.status_code == 403, (method, path, r.text)
                assert r.json()["error"]["code"] == "internal_endpoints_off"
                assert "--internal-api-key" in r.json()["error"]["message"]


async def test_internal_endpoints_take_only_the_internal_key(
    settings: Settings, fake_engine: FakeEngine
) -> None:
    async with serve(settings, fake_engine, api_key=KEYS, internal_api_key="int-key") as (
        _,
        client,
    ):
        for method, path in INTERNAL_PATHS:
            for headers in ({}, {"Authorization": "Bearer sk-one"}, {"X-Api-Key": "sk-two"}):
                r = await client.request(method, path, headers=headers)
                assert r.status_code == 401, (method, path, r.text)
                assert r.json()["error"]["code"] == "invalid_internal_key"
        internal = {"Authorization": "Bearer int-key"}
        assert (await client.get("/internal/v1/info", headers=internal)).status_code == 200
        # ... and the internal key is no client key.
        assert (await client.get("/v1/models", headers=internal)).status_code == 401
