"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import MAX_MODEL_LEN, MODEL


async def test_list_models(client: httpx.AsyncClient, tokenizer_dir: Path) -> None:
    expected_root = str(tokenizer_dir.resolve())  # noqa: ASYNC240 - a test fixture's path
    r = await client.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["max_model_len"] == MAX_MODEL_LEN
    # the tokenizer's directory, as vLLM puts the model path in root: what AIPerf's and
    # guidellm's --tokenizer / --processor take
    assert body["data"][0]["root"] == expected_root


async def test_get_model(client: httpx.AsyncClient) -> None:
    r = await client.get(f"/v1/models/{MODEL}")
    assert r.status_code == 200
    assert r.json()["id"] == MODEL


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models/other")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=client)
    with pytest.raises(openai.NotFoundError):
        await sdk.models.retrieve("other")
    assert [m.id async for m in sdk.models.list()] == [MODEL]


async def test_unknown_route_is_openai_error(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFoundError"
