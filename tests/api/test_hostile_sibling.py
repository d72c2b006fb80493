"""/internal/v1/prefill takes SamplingParams whole from a sibling; anyone who can reach it gets
a 400 for a value no public request could carry, never a 500 (or an engine step that fails)."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from trtllm_gateway.config.settings import Settings

URL = "/internal/v1/prefill"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"internal_api_key": SecretStr("int-key")})


@pytest.fixture
def client(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """The sibling's client: it presents the internal key."""
    client.headers["Authorization"] = "Bearer int-key"
    return client


def prefill(**sampling: Any) -> dict[str, Any]:
    return {"request_id": "sib-1", "prompt_token_ids": [1, 2, 3], "sampling": sampling}


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"temperature": "x"}, "sampling"),
        ({"seed": "a"}, "sampling"),
        ({"seed": 2**70}, "sampling"),
        ({"guided": {"kind": "xx", "spec": ""}}, "sampling"),
        ({"max_tokens": -5}, "sampling"),
        ({"top_p": 0}, "sampling"),
        ({"top_k": -3}, "sampling"),
        ({"repetition_penalty": 0}, "sampling"),
        ({"logprobs": 10**9}, "logprobs"),
        ({"logprobs": -3}, "logprobs"),
        ({"prompt_logprobs": 10**6}, "prompt_logprobs"),
        ({"stop_token_ids": [-1], "min_tokens": 2}, "stop_token_ids"),
        ({"logit_bias": [[-1, 5.0]]}, "logit_bias"),
        ({"allowed_token_ids": [-100000]}, "allowed_token_ids"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
    ],
)
async def test_hostile_sibling_sampling(
    client: httpx.AsyncClient, sampling: dict[str, Any], param: str
) -> None:
    r = await client.post(URL, json=prefill(**sampling))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
async def test_non_finite_sibling_sampling(client: httpx.AsyncClient, value: str) -> None:
    text = f'{{"request_id": "s", "prompt_token_ids": [1], "sampling": {{"temperature": {value}}}}}'
    r = await client.post(URL, content=text, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text


async def test_ordinary_sibling_sampling_passes(client: httpx.AsyncClient) -> None:
    sampling = {"max_tokens": 4, "temperature": 0.0, "logprobs": 2, "seed": -(2**63)}
    r = await client.post(URL, json=prefill(**sampling))
    assert r.status_code == 200, r.text
    assert not math.isnan(r.json()["prompt_tokens"])


@pytest.mark.parametrize(
    "guided",
    [
        {"kind": "regex", "spec": "a" * 1_300_000},  # past --max-grammar-bytes (64 KiB)
        {"kind": "regex", "spec": "a+", "start_after": [-5]},
    ],
)
async def test_sibling_grammars_meet_the_public_bounds(
    client: httpx.AsyncClient, guided: dict[str, Any]
) -> None:
    """Issue 24: the sibling path skipped --max-grammar-bytes and took a negative start_after."""
    r = await client.post(URL, json=prefill(guided=guided))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "sampling"


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"kv_transport": "rdma"}, "kv_transport"), ({"protocol_version": 1}, "protocol_version")],
)
async def test_hostile_v2_prefill_body(
    client: httpx.AsyncClient, extra: dict[str, Any], param: str
) -> None:
    """Protocol v2's body is checked as v1's is: a 400 naming the field, before any work."""
    body = {**prefill(), "protocol_version": 2, **extra}
    r = await client.post("/internal/v2/prefill", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
