"""PNG bombs beside victims on a real server with a tiny random LLaVA (issue 24 item 6).

Eight different large-but-legal 1-bit PNGs of a few KB each, sent at once as data URLs, decode
to megapixels of RGB each. The decoded-pixel budget (--max-image-pixels-in-flight) lets two
requests hold their pixels at a time: /metrics never shows more in flight, every image request
ends (200, or a 503 if it waited past --media-fetch-timeout), text requests beside them get the
answers they get alone, and a request whose images alone exceed the budget is a 400.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.e2e.server import Server
from tests.engine.tiny_llava import build_tiny_llava

SIDE = 2000  # 4 MP, 12 MB of RGB per image
BUDGET = 2 * SIDE * SIDE
IN_FLIGHT = "trtllm_gateway:image_pixels_in_flight"
PROMPTS = ["describe a red square", "what is two plus two", "say hello"]


def bomb(seed: int) -> str:
    image = Image.new("1", (SIDE, SIDE))
    image.putpixel((seed, seed), 1)  # a different image each: no cache hit shares pixels
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[Server]:
    model = build_tiny_llava(tmp_path_factory.mktemp("llava-bombs") / "model", "llava")
    args = [
        "--model", str(model), "--device", "cpu", "--dtype", "float32",
        "--num-kv-blocks", "256", "--block-size", "4",
        "--max-image-pixels", str(SIDE * SIDE),
        "--max-image-pixels-in-flight", str(BUDGET),
    ]  # fmt: skip
    srv = Server(args=args).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def body(content: Any) -> dict[str, Any]:
    return {
        "model": "model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }


def with_images(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return body([*parts, {"type": "text", "text": "describe the picture"}])


async def ask(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> httpx.Response:
    return await client.post(f"{url}/v1/chat/completions", json=payload)


def text_of(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


async def test_png_bombs_stay_within_the_pixel_budget(vlm: Server) -> None:
    bombs = [bomb(i) for i in range(8)]
    assert max(len(b) for b in bombs) < 8000  # a few KB each on the wire
    async with httpx.AsyncClient(timeout=120) as client:
        alone = [text_of(await ask(client, vlm.url, body(p))) for p in PROMPTS]
        seen: list[float] = []
        done = asyncio.Event()

        async def watch() -> None:
            while not done.is_set():
                seen.append(await asyncio.to_thread(vlm.metric, IN_FLIGHT))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        attacks = [ask(client, vlm.url, with_images(b)) for b in bombs]
        victims = [ask(client, vlm.url, body(p)) for p in PROMPTS]
        answers = await asyncio.wait_for(asyncio.gather(*attacks, *victims), 120)
        done.set()
        await watcher
    hits, beside = answers[: len(bombs)], answers[len(bombs) :]
    assert [text_of(r) for r in beside] == alone
    served = 0
    for r in hits:
        if r.status_code == 503:  # waited past --media-fetch-timeout: a clear, retryable error
            assert r.json()["error"]["code"] == "image_budget_busy", r.text
        else:
            assert text_of(r)
            served += 1
    assert served >= 2
    assert seen and max(seen) <= BUDGET
    assert SIDE * SIDE <= vlm.metric("trtllm_gateway:image_pixels_in_flight_peak") <= BUDGET
    assert vlm.metric(IN_FLIGHT) == 0  # released with responses


async def test_images_over_the_whole_budget_are_a_400(vlm: Server) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await ask(client, vlm.url, with_images(bomb(1), bomb(2), bomb(3)))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("image_too_large", "messages")
    assert "--max-image-pixels-in-flight" in error["message"]
    assert vlm.metric(IN_FLIGHT) == 0
