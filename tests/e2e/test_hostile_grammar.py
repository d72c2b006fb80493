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
BOMBS = [{"structured_outputs": {"regex": f"{c}{{1000000}}"}} for c in "abcdefg"] + [
    {"structured_outputs": {"grammar": 'start: "a"{1000000}'}}
]
# The same number of ordinary one-token requests beside the victims: the prefill any new
# requests cost them. Built in the step loop, the bombs stalled every stream for 2-5 s more
# than these here; built off it, 0.1-0.3 s more on two busy cores (load 4-7).
CONTROL: list[dict[str, object]] = [{"max_tokens": 1}] * len(BOMBS)
MAX_EXTRA_GAP_S = 1.5


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


async def _victims(
    client: httpx.AsyncClient, url: str, bombs: list[dict[str, object]]
) -> tuple[list[str], float, list[httpx.Response]]:
    """The three streaming victims, the bombs sent once each victim streams: the victims'
    texts, their worst gap and the bombs' responses."""
    started = [asyncio.Event() for _ in VICTIM_PROMPTS]
    streams = [
        asyncio.create_task(_streamed(client, url, p, ev))
        for p, ev in zip(VICTIM_PROMPTS, started, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 60)
    hits = await asyncio.gather(*(_bomb(client, url, b) for b in bombs))
    done = await asyncio.gather(*streams)
    return [text for text, _ in done], max(gap for _, gap in done), hits


async def test_grammar_bombs_do_not_stall_the_streams(server: Server) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        url = server.url
        expected = [
            (await client.post(f"{url}/v1/chat/completions", json=chat(p, max_tokens=48))).json()[
                "choices"
            ][0]["message"]["content"]
            for p in VICTIM_PROMPTS
        ]
        alone, baseline, controls = await _victims(client, url, CONTROL)
        t0 = time.monotonic()
        beside, worst, hits = await _victims(client, url, BOMBS)
        bomb_s = time.monotonic() - t0
    assert all(r.status_code == 200 for r in controls)
    for r in hits:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"].startswith("structured_outputs"), r.text
    assert alone == expected
    assert beside == expected
    assert worst < baseline + MAX_EXTRA_GAP_S, (
        f"a victim waited {worst:.2f} s for a token beside the bombs, {baseline:.2f} s beside "
        "as many ordinary requests "
        f"(bombs and victims: {bomb_s:.1f} s)"
    )
    assert server.metric("trtllm_gateway:kv_cache_usage_perc") == 0
