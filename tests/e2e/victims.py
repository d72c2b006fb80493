"""Victims: ordinary greedy requests sent beside a hostile one (issues 15 and 24).

Each must come back 200 with the text it gets when sent alone, whatever the attack beside it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.e2e.ops_client import MODEL

VICTIM_PROMPTS = ["Name three colors.", "What is 2+2?", "Say hello in French."]


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 24,
        "temperature": 0,
        **extra,
    }


async def victim(
    client: httpx.AsyncClient, url: str, prompt: str, headers: dict[str, str] | None = None
) -> str:
    r = await client.post(f"{url}/v1/chat/completions", json=chat(prompt), headers=headers)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


async def victims(
    client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
) -> list[str]:
    """The three ordinary requests at once; each one's text (each must be a 200)."""
    return list(await asyncio.gather(*(victim(client, url, p, headers) for p in VICTIM_PROMPTS)))


_ALONE: dict[str, list[str]] = {}  # by server URL: greedy answers do not change


async def alone(
    client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
) -> list[str]:
    """The victims' answers one at a time, nothing beside them: what they must get under attack
    (asked once per server)."""
    if url not in _ALONE:
        _ALONE[url] = [await victim(client, url, p, headers) for p in VICTIM_PROMPTS]
    return list(_ALONE[url])
