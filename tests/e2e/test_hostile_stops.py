"""Stop strings beside streaming victims on the real server (issue 40, item 4).

Before the fix, one request with n=16 and 12,000 four-character stop strings took other
clients' time to first token from 0.16 s to 9.1 s: every token of every choice ran `find` and
`endswith` over every stop, on the event loop. Now such a request is a 400 (at most 64 stops,
4,096 characters), and the stops a request may give are matched by one automaton, linear in
the text: the victims' time to first token beside the largest allowed set (each stop starting
with a common character, so that text is held back all the time) stays that beside the same
request without stops, and their answers stay what they are alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx

from tests.e2e.ops_client import MODEL
from tests.e2e.server import Server
from tests.e2e.victims import VICTIM_PROMPTS, alone, chat
from trtllm_gateway.routers.openai.validation import MAX_STOP_CHARS, MAX_STOP_STRINGS

ATTACK: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
    "n": 16,
    "max_tokens": 96,
    "ignore_eos": True,
    "temperature": 1.0,
    "seed": 11,
    "stream": True,
}
ISSUE_STOPS = [f"{i:04x}" for i in range(12000)]
# As many stops and characters as allowed, each a common character then padding: some prefix
# of a stop ends the text at almost every token.
COMMON = " etaoinshrdlucmfwypvbgkqjxzETAOINSHRDLUCMFWYPVBGKQJXZ.,;:!?'-()0123"
LONGEST = [c + "~" * (MAX_STOP_CHARS // MAX_STOP_STRINGS - 1) for c in COMMON[:MAX_STOP_STRINGS]]
MAX_EXTRA_TTFT_S = 1.0


async def _victim(client: httpx.AsyncClient, url: str, prompt: str) -> tuple[str, float]:
    """A streaming victim's text and its time to first content."""
    t0, first, text = time.monotonic(), None, ""
    body = chat(prompt, stream=True)
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if delta and first is None:
                first = time.monotonic() - t0
            text += delta
    assert first is not None
    return text, first


async def _attacker(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], started: asyncio.Event
) -> None:
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                started.set()
    started.set()


async def _beside(
    client: httpx.AsyncClient, server: Server, body: dict[str, Any]
) -> tuple[list[str], float]:
    """The victims sent once the attacker streams: their texts and worst time to first token.

    The attacker streams beside the victims from their first byte to their last; once they are
    done its remaining tokens measure nothing, so it is cancelled (its requests aborted) rather
    than streamed to max_tokens, and the next measurement waits until the engine is idle again.
    """
    url = server.url
    started = asyncio.Event()
    attacker = asyncio.create_task(_attacker(client, url, body, started))
    await asyncio.wait_for(started.wait(), 120)
    done = await asyncio.gather(*(_victim(client, url, p) for p in VICTIM_PROMPTS))
    assert not attacker.done(), "the attacker ended before the victims: it was not beside them"
    attacker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await attacker
    await _idle(server)
    return [text for text, _ in done], max(ttft for _, ttft in done)


async def _idle(server: Server, limit_s: float = 60.0) -> None:
    """Until the engine runs and queues nothing (the cancelled attacker's rows aborted)."""
    deadline = time.monotonic() + limit_s
    busy = ("trtllm_gateway:num_requests_running", "trtllm_gateway:num_requests_waiting")
    while sum(server.metric(name) for name in busy) > 0:
        assert time.monotonic() < deadline, "the aborted attacker still runs"
        await asyncio.sleep(0.05)


async def test_stop_strings_do_not_stall_the_victims(server: Server) -> None:
    url = server.url
    async with httpx.AsyncClient(timeout=300) as client:
        expected = await alone(client, url)
        r = await client.post(f"{url}/v1/chat/completions", json={**ATTACK, "stop": ISSUE_STOPS})
        assert r.status_code == 400, r.text[:300]
        assert r.json()["error"]["param"] == "stop"
        plain, control = await _beside(client, server, ATTACK)
        beside, worst = await _beside(client, server, {**ATTACK, "stop": LONGEST})
    print(f"victims' worst TTFT: {control:.2f} s beside n=16, {worst:.2f} s with its stops")
    assert plain == expected
    assert beside == expected
    assert worst < control + MAX_EXTRA_TTFT_S, (worst, control)
