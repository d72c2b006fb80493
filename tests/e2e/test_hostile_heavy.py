"""Heavy valid requests do not starve the rest (issue 24, item 8), on the real server with its
default flags: one HTTP request runs at most --max-running-choices (16) of its choices at once,
so victims sent while a request of n=128 streams are scheduled beside it, not behind its 128
engine requests (the scheduler is first come, first served). Before the bound, the victims
waited for the heavy request's first 64 choices (the batch) to end."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.e2e.ops_client import MODEL
from tests.e2e.server import Server
from tests.e2e.victims import alone, victims

HEAVY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
    "n": 128,
    "max_tokens": 160,
    "ignore_eos": True,
    "temperature": 1.0,
    "seed": 7,
    "stream": True,
}


async def test_a_request_with_many_choices_does_not_starve_victims(server: Server) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        expected = await alone(client, server.url)
        finished: list[int] = []  # heavy choices ended, in order
        started = asyncio.Event()

        async def heavy() -> None:
            async with client.stream("POST", f"{server.url}/v1/chat/completions", json=HEAVY) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    for choice in json.loads(line[6:])["choices"]:
                        if choice["delta"].get("content"):
                            started.set()
                        if choice.get("finish_reason"):
                            finished.append(choice["index"])

        task = asyncio.create_task(heavy())
        try:
            await asyncio.wait_for(started.wait(), 120)  # its choices are in the engine
            got = await victims(client, server.url)
            ended_before_victims = len(finished)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert got == expected
        # Each heavy choice needs 160 steps, a victim 24: beside the heavy request the victims
        # end first; queued behind its batch they end after at least its first wave.
        assert ended_before_victims == 0, ended_before_victims
        # The cancelled request's engine requests are gone: the server is idle again.
        for _ in range(120):
            health = (await client.get(f"{server.url}/health")).json()
            if (health["running"], health["waiting"]) == (0, 0):
                break
            await asyncio.sleep(0.5)
        assert (health["running"], health["waiting"]) == (0, 0), health
