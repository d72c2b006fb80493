"""The TensorRT-LLM adapter behind the real HTTP app (in process), over the stand-in library.

The model directory pairs the tests' tiny ChatML tokenizer with a Llama-3-like EOS layout:
config.json names <|endoftext|> (end_id) while the model ends its turns with <|im_end|>, which
generation_config.json lists too. What the OpenAI client sees for issue 12's items 1, 2 and 5
and for issue 11 on TensorRT-LLM.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from tests.configs import trtllm_engine_of
from tests.conftest import wait_ready
from tests.standin import ensure_on_path
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings

ensure_on_path()


MODEL = "tiny-trtllm"


@pytest.fixture
def model_dir(tokenizer_dir: Path, tmp_path: Path) -> Path:
    path = tmp_path / "model"
    shutil.copytree(tokenizer_dir, path)
    config = {
        "model_type": "llama",
        "vocab_size": 400,
        "eos_token_id": 0,  # <|endoftext|>
        "max_position_embeddings": 1024,
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    return path


async def _client(model_dir: Path, **flags: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = Settings(engine="trtllm", model=str(model_dir), served_model_name=MODEL, **flags)
    app = create_app(config.parts(), engine=trtllm_engine_of(config.parts()))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await wait_ready(client)
            yield client


@pytest.fixture
async def client(model_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(model_dir, guided_decoding_backend="llguidance"):
        yield c


def _chat(**body: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello world"}], **body}


async def test_end_of_turn_is_a_plain_stop(client: httpx.AsyncClient) -> None:
    """Item 1: <|im_end|> (generation_config.json) ends the turn; no stop_reason, not in text."""
    r = await client.post("/v1/chat/completions", json=_chat(max_tokens=200))
    choice = r.json()["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    assert r.json()["usage"]["completion_tokens"] < 64
    assert "<|im_end|>" not in choice["message"]["content"]


async def test_logprobs_true_alone_gives_each_token_its_logprob(client: httpx.AsyncClient) -> None:
    """Item 5: TensorRT-LLM treats logprobs=0 as none; the adapter asks for one and trims."""
    r = await client.post("/v1/chat/completions", json=_chat(max_tokens=5, logprobs=True))
    body = r.json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    assert all(t["logprob"] <= 0 and t["top_logprobs"] == [] for t in content)


async def test_structured_choice(client: httpx.AsyncClient) -> None:
    """Issue 11: GuidedDecodingParams under guided_decoding_backend=llguidance."""
    body = _chat(max_tokens=8, structured_outputs={"choice": ["yes", "no"]})
    r = await client.post("/v1/chat/completions", json=body)
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")


async def test_prompt_over_max_num_tokens_is_a_400_naming_both(model_dir: Path) -> None:
    """Item 2: without chunked prefill a prompt over max_num_tokens cannot run."""
    async for client in _client(model_dir, max_num_tokens=16):
        r = await client.post("/v1/chat/completions", json=_chat(max_tokens=4))
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert "max_num_tokens (16)" in message and "--enable-chunked-prefill" in message


async def test_structured_output_without_a_backend_is_a_400(model_dir: Path) -> None:
    async for client in _client(model_dir):
        body = _chat(max_tokens=4, response_format={"type": "json_object"})
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400
        assert "--guided-decoding-backend" in r.json()["error"]["message"]


async def test_echo_prompt_logprobs_outside_top_k_are_null(client: httpx.AsyncClient) -> None:
    """Item 4 on the wire: TensorRT-LLM's prompt logprobs are top-k dicts without the real token
    (executor/result.py); a prompt token outside the top-k has no known value: null, not -9999."""
    body = {"model": MODEL, "prompt": "Hello world, how are you", "max_tokens": 1}
    r = await client.post("/v1/completions", json={**body, "echo": True, "logprobs": 1})
    values = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    prompt_values = values[1:-1]  # the first prompt token has none; the last is generated
    assert values[0] is None
    assert -9999.0 not in values
    assert None in prompt_values  # the scripted model ranks some prompt tokens outside top-1
    assert any(v is not None and v <= 0 for v in prompt_values)


async def test_sampled_logprobs_outside_the_top_20_are_never_a_made_up_value(
    client: httpx.AsyncClient,
) -> None:
    """Issue 21 item 1 on the wire: at temperature 1 the 1.2 TorchSampler's top k (sampler.py)
    often lacks the sampled token. Completions say null for it (the legacy schema allows it);
    chat, whose schema has no null, says -9999.0, OpenAI's "not within the top 20"."""
    body = {"model": MODEL, "prompt": "Hello world", "max_tokens": 40, "logprobs": 1}
    r = await client.post("/v1/completions", json={**body, "temperature": 1.0})
    values = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert -9999.0 not in values
    assert None in values and any(v is not None and v < 0 for v in values)
    chat = _chat(max_tokens=40, logprobs=True, top_logprobs=1, temperature=1.0)
    content = (await client.post("/v1/chat/completions", json=chat)).json()["choices"][0]
    content = content["logprobs"]["content"]
    assert all(t["logprob"] == -9999.0 or -9999.0 < t["logprob"] <= 0 for t in content)
    assert all(len(t["top_logprobs"]) == 1 for t in content)


async def test_lora_adapter_selected_by_model_name(model_dir: Path, tmp_path: Path) -> None:
    """Issue 21 item 6: as vLLM and trtllm-serve, the model name selects a loaded adapter and
    /v1/models lists it (parent: the base model); the response names the adapter."""
    adapter = tmp_path / "sql-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"stand-in weights")
    async for client in _client(model_dir, lora_modules=[f"sql={adapter}"]):
        models = (await client.get("/v1/models")).json()["data"]
        assert [(m["id"], m.get("parent")) for m in models] == [(MODEL, None), ("sql", MODEL)]
        assert (await client.get("/v1/models/sql")).status_code == 200
        body = {"prompt": "Hello world", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        base = await client.post("/v1/completions", json={**body, "model": MODEL})
        tuned = await client.post("/v1/completions", json={**body, "model": "sql"})
        assert tuned.status_code == 200 and tuned.json()["model"] == "sql"
        assert tuned.json()["choices"][0]["text"] != base.json()["choices"][0]["text"]
        missing = await client.post("/v1/completions", json={**body, "model": "other"})
        assert missing.status_code == 404
