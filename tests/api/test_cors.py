"""CORS: off by default; with --allowed-origins, preflights are answered (before auth) and
X-Request-Id is exposed to browsers."""

from __future__ import annotations

from tests.api.ops_helpers import CHAT, serve
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings

ORIGIN = "https://app.example"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}


async def test_off_by_default(settings: Settings, fake_engine: FakeEngine) -> None:
    async with serve(settings, fake_engine) as (_, client):
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": ORIGIN})
        assert r.status_code == 200
        assert "access-control-allow-origin" not in r.headers
        r = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in r.headers


async def test_allowed_origin(settings: Settings, fake_engine: FakeEngine) -> None:
    async with serve(settings, fake_engine, allowed_origins=[ORIGIN], api_key=["sk-1"]) as (
        _,
        client,
    ):
        r = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in r.headers["access-control-allow-methods"]
        auth = {"Origin": ORIGIN, "Authorization": "Bearer sk-1"}
        r = await client.post("/v1/chat/completions", json=CHAT, headers=auth)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": ORIGIN})
        assert r.status_code == 401
        assert r.headers["access-control-allow-origin"] == ORIGIN  # browsers can read the 401
        other = {**PREFLIGHT, "Origin": "https://evil.example"}
        r = await client.options("/v1/chat/completions", headers=other)
        assert r.status_code == 400
        assert "access-control-allow-origin" not in r.headers
