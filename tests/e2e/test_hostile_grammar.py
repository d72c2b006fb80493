"""Grammar bombs beside streaming victims on the real server (issue 24 item 4).

A few bytes of regex or Lark (`a{1000000}`) make llguidance build a huge lexer the first time a
mask is asked for. Built in the engine's step loop, that stalled every stream for seconds; built
off it, the victims' inter-token gaps stay small and their answers stay what they are alone,
while each bomb still gets its 400.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.e2e.server import Server
from tests.e2e.victims import VICTIM_PROMPTS, chat

# Distinct specs, so that no compiled template is shared between the bombs (each pays in full).
BOMBS = [{"structured_outputs": {"regex": f"{c}{{1000000}}"}} for c in "abcd"] + [
    {"structured_outputs": {"grammar": 'start: "a"{1000000}'}}
]
MAX_GAP_S = 1.0  # a stalled step loop held every stream for 2-6 s here before the fix


async def _streamed(
    client: httpx.AsyncClient, url: str, prompt: str, started: asyncio.Event
) -> tuple[str, float]:
    """The victim's text and its longest gap between two content chunks."""
    body = chat(prompt, stream=True, max_tokens=48)
    text, gaps, last = "", [], None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice["delta"].get("content") or ""
            if not delta:
                continue
            now = time.monotonic()
            if last is not None:
                gaps.append(now - last)
            last = now
            text += delta
            started.set()
    return text, max(gaps, default=0.0)


async def _bomb(client: httpx.AsyncClient, url: str, extra: dict[str, object]) -> httpx.Response:
    return await client.post(f"{url}/v1/chat/completions", json=chat("Hi", **extra))


async def test_grammar_bombs_do_not_stall_the_streams(server: Server) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        expected = [
            (
                await client.post(f"{server.url}/v1/chat/completions", json=chat(p, max_tokens=48))
            ).json()["choices"][0]["message"]["content"]
            for p in VICTIM_PROMPTS
        ]
        started = [asyncio.Event() for _ in VICTIM_PROMPTS]
        streams = [
            asyncio.create_task(_streamed(client, server.url, p, ev))
            for p, ev in zip(VICTIM_PROMPTS, started, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 60)
        t0 = time.monotonic()
        bombs = await asyncio.gather(*(_bomb(client, server.url, b) for b in BOMBS))
        bomb_s = time.monotonic() - t0
        beside = await asyncio.gather(*streams)
    for r in bombs:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"].startswith("structured_outputs"), r.text
    assert [text for text, _ in beside] == expected
    worst = max(gap for _, gap in beside)
    assert worst < MAX_GAP_S, f"a victim waited {worst:.2f} s for a token (bombs: {bomb_s:.1f} s)"
    assert server.metric("trtllm_gateway:kv_cache_usage_perc") == 0
