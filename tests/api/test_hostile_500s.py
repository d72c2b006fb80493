"""Three bodies that were 500s (issue 24, item 7), each a 400 naming its field now: a lone
surrogate in `model` (the model check ran first and its error could not be encoded), a 5,000-digit
logit_bias key (past int()'s digit limit), and a 10,000-deep `sampling` in a sibling's prefill
(RecursionError, the connection reset)."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

from tests.conftest import MODEL
from trtllm_gateway.config.settings import Settings

JSON = {"content-type": "application/json"}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"internal_api_key": SecretStr("int-key")})


def chat_text(model: str = f'"{MODEL}"', extra: str = "") -> str:
    return f'{{"model": {model}, "messages": [{{"role": "user", "content": "hi"}}]{extra}}}'


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_lone_surrogate_in_model_is_a_400(client: httpx.AsyncClient, path: str) -> None:
    body = chat_text('"\\ud800"') if "chat" in path else '{"model": "\\udc00x", "prompt": "hi"}'
    r = await client.post(path, content=body, headers=JSON)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "model" and "surrogate" in error["message"]


async def test_a_5000_digit_logit_bias_key_is_a_400(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", content=chat_text(extra=f', "logit_bias": {{"{"7" * 5000}": 1}}'),
        headers=JSON,
    )  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "logit_bias"


@pytest.mark.parametrize("depth", [200, 10_000])
async def test_deeply_nested_sibling_sampling_is_a_400(
    client: httpx.AsyncClient, depth: int
) -> None:
    sampling = '{"x": ' * depth + "1" + "}" * depth
    body = f'{{"request_id": "deep", "prompt_token_ids": [1, 2], "sampling": {sampling}}}'
    headers = {**JSON, "Authorization": "Bearer int-key"}
    r = await client.post("/internal/v1/prefill", content=body, headers=headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "sampling" or "nested too deeply" in error["message"], error
    assert (await client.post("/v1/chat/completions", content=chat_text(), headers=JSON)).is_success
