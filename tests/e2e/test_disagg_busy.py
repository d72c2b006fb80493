"""A busy prefill sibling is not a dead one (issue 41 item 5), on two real processes of the
default model: a prefill instance whose queue holds two long prompts (--max-queued-prefill-tokens)
and a decode instance sent many long prompts at once. The sibling answers 503 with its queue;
the decode side retries or prefills locally by policy; nobody is marked unhealthy, every prompt
is served with the aggregated instance's greedy tokens, and the path counters add up."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.ops_client import INTERNAL_KEY
from tests.e2e.server import Server
from trtllm_gateway.engine.stats import OUTCOMES

INTERNAL = ["--internal-api-key", INTERNAL_KEY]
PROMPT_LEN = 256
PROMPTS = 8


@pytest.fixture(scope="module")
def busy_prefill(log_dir: Path) -> Iterator[Server]:
    queue = ["--max-queued-prefill-tokens", str(2 * PROMPT_LEN)]  # two long prompts at a time
    srv = Server(args=["--mode", "prefill", "--num-kv-blocks", "512", *INTERNAL, *queue])
    srv.start(log_dir)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def decode_of_busy(busy_prefill: Server, log_dir: Path) -> Iterator[Server]:
    args = ["--mode", "decode", "--prefill-url", busy_prefill.url, "--num-kv-blocks", "512"]
    # A deadline far past this shared CPU's slowest context phase (30 s and more for 320 tokens
    # with five other test runs on two cores): the test is about busy, not slow.
    slow = ["--remote-prefill-timeout", "600"]
    srv = Server(args=[*args, *INTERNAL, "--max-local-prefill-tokens", "64", *slow])
    srv.start(log_dir)
    yield srv
    srv.stop()


def prompts() -> list[list[int]]:
    """Distinct from their first token on, so no prefix cache turns one into a short prompt."""
    rng = random.Random(41)
    return [
        [1000 + i, *(rng.randrange(200, 40000) for _ in range(PROMPT_LEN - 1))]
        for i in range(PROMPTS)
    ]


async def completions(url: str, ids: list[list[int]]) -> list[list[str]]:
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(prompt: list[int]) -> list[str]:
            body = {
                "model": "SmolLM2-135M-Instruct",
                "prompt": prompt,
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
                "logprobs": 0,
            }
            r = await client.post(f"{url}/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return list(r.json()["choices"][0]["logprobs"]["tokens"])

        return list(await asyncio.gather(*(one(p) for p in ids)))


def outcomes(srv: Server) -> dict[str, float]:
    name = "trtllm_gateway:remote_prefill_total"
    return {o: srv.metric(name, f'outcome="{o}"') for o in OUTCOMES}


async def test_a_busy_sibling_is_waited_for_or_passed_over_never_marked(
    server: Server, busy_prefill: Server, decode_of_busy: Server
) -> None:
    ids = prompts()
    before = outcomes(decode_of_busy)
    got = await completions(decode_of_busy.url, ids)
    after = outcomes(decode_of_busy)
    delta = {o: after[o] - before[o] for o in OUTCOMES}
    # Every prompt took exactly one path, and the sibling's bound made some of them wait.
    assert sum(delta.values()) == PROMPTS, delta
    busy = decode_of_busy.metric("trtllm_gateway:remote_prefill_busy_total")
    assert busy > 0, delta
    assert delta["remote"] + delta["remote_retried"] > 0, delta
    assert delta["local_fallback"] == 0 and delta["failed"] == 0, delta
    # Busy is not dead: the sibling was never marked, and no prompt fell back after a failure.
    healthy = decode_of_busy.metric("trtllm_gateway:sibling_healthy", busy_prefill.url)
    assert healthy == 1.0
    assert "no healthy prefill sibling" not in decode_of_busy.log()
    # The same greedy tokens as one aggregated instance, whichever path each prompt took.
    expected = await completions(server.url, ids)
    assert got == expected
