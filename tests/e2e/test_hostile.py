"""Hostile input against the real server on SmolLM2 (issue 15): the issue's attack beside three
ordinary requests, logit_bias and allowed_token_ids on the real sampler, and a SIGTERM echoed to
the process (as `make serve` under a process-group kill delivers it) that ends without a
traceback."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.ops_client import INTERNAL_AUTH, MODEL
from tests.e2e.server import Server
from tests.e2e.victims import VICTIM_PROMPTS, chat, victim, victims
from trtllm_gateway.engine.model_source import resolve_model
from trtllm_gateway.engine.tokenizer import Tokenizer

ATTACK = {"stop_token_ids": [-100000], "min_tokens": 2}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(resolve_model("default"))


async def test_attack_beside_three_victims(server: Server) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        alone = [await victim(client, server.url, p) for p in VICTIM_PROMPTS]  # one at a time
        attack = client.post(f"{server.url}/v1/chat/completions", json=chat("Hi", **ATTACK))
        streamed_attack = client.post(
            f"{server.url}/v1/chat/completions", json=chat("Hi", stream=True, **ATTACK)
        )
        hit, hit_stream, beside = await asyncio.gather(
            attack, streamed_attack, victims(client, server.url)
        )
    for r in (hit, hit_stream):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "stop_token_ids"
    assert beside == alone
    assert server.metric("trtllm_gateway:kv_cache_usage_perc") == 0


async def test_logit_bias_forces_a_token(server: Server, tokenizer: Tokenizer) -> None:
    (forced,) = tokenizer.encode(" banana", add_special_tokens=False)
    body = {
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 6,
        "temperature": 0,
        "logit_bias": {str(forced): 100},
    }
    async with httpx.AsyncClient(timeout=120) as client:
        r = await client.post(f"{server.url}/v1/completions", json=body)
        plain = await client.post(f"{server.url}/v1/completions", json={**body, "logit_bias": {}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == " banana" * 6
    assert "banana" not in plain.json()["choices"][0]["text"]


async def test_logit_bias_minus_100_bans_the_greedy_token(
    server: Server, tokenizer: Tokenizer
) -> None:
    body = {"model": MODEL, "prompt": "1, 2, 3, 4,", "max_tokens": 1, "temperature": 0}
    async with httpx.AsyncClient(timeout=120) as client:
        first = await client.post(f"{server.url}/v1/completions", json=body)
        assert first.status_code == 200, first.text
        chosen = first.json()["choices"][0]["text"]
        (greedy,) = tokenizer.encode(chosen, add_special_tokens=False)
        bias = {"logit_bias": {str(greedy): -100}}
        r = await client.post(f"{server.url}/v1/completions", json={**body, **bias})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] != chosen


@pytest.mark.parametrize("stream", [False, True])
async def test_allowed_token_ids_restrict_the_output(
    server: Server, tokenizer: Tokenizer, stream: bool
) -> None:
    allowed = [tokenizer.encode(w, add_special_tokens=False)[0] for w in (" yes", " no")]
    body = chat("Is the sky green?", max_tokens=8, allowed_token_ids=allowed, stream=stream)
    async with httpx.AsyncClient(timeout=120) as client:
        r = await client.post(f"{server.url}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    if stream:
        pieces = re.findall(r'"content":"([^"]*)"', r.text)
        text = "".join(pieces)
    else:
        text = r.json()["choices"][0]["message"]["content"]
    assert text, r.text
    assert re.fullmatch(r"( yes| no)+", text), text


def test_echoed_sigterm_ends_without_a_traceback(log_dir: Path) -> None:
    """Two SIGTERMs back to back (a process-group kill of `make serve`: make passes its own on)
    stop the server with status 0, the engine stopped and no traceback in the log."""
    srv = Server(args=["--num-kv-blocks", "64"]).start(log_dir)
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(30) == 0, srv.log()
    log = srv.log()
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert "engine stopped" in log, log


SIBLING_ATTACKS: list[dict[str, Any]] = [
    {"prompt_logprobs": 10**6},  # was an engine step failure: the engine died, the server exited
    {"logprobs": 10**9},
    {"seed": 2**70},
    {"seed": "a"},
    {"temperature": "x"},
    {"guided": {"kind": "xx", "spec": ""}},
    {"stop_token_ids": [-100000], "min_tokens": 2},
]


async def test_sibling_endpoint_attacks_leave_the_engine_serving(server: Server) -> None:
    """/internal/v1/prefill takes SamplingParams whole from whoever holds the internal key:
    hostile sampling there is a 400 and the engine keeps serving."""
    async with httpx.AsyncClient(timeout=120) as client:
        for i, sampling in enumerate(SIBLING_ATTACKS):
            body = {
                "request_id": f"hostile-{i}",
                "prompt_token_ids": [1, 2, 3],
                "sampling": sampling,
            }
            r = await client.post(
                f"{server.url}/internal/v1/prefill", json=body, headers=INTERNAL_AUTH
            )
            assert r.status_code == 400, (sampling, r.text)
        assert await victims(client, server.url)
    assert server.metric("trtllm_gateway:kv_cache_usage_perc") == 0
