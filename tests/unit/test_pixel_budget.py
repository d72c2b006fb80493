"""PixelBudget: decoded pixels in flight across requests (issue 24 item 6), alone and under
load_chat_images with small PNG bombs (large, legal, 1-bit images of a few KB)."""

from __future__ import annotations

import asyncio
import base64
import io
import random
from pathlib import Path

import httpx
import pytest
from PIL import Image

from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.multimodal import (
    MediaBusyError,
    MediaCache,
    MediaMetrics,
    MediaRejectedError,
    PixelBudget,
    create_pixel_budget,
    load_chat_images,
)
from trtllm_gateway.web.shared_counts import SharedCounts


async def test_grants_in_order_and_release_wakes_the_next() -> None:
    budget = PixelBudget(100)
    a, b, c = budget.lease(), budget.lease(), budget.lease()
    await a.acquire(60, 1.0)
    waiting_b = asyncio.create_task(b.acquire(60, 5.0))
    await asyncio.sleep(0.01)
    waiting_c = asyncio.create_task(c.acquire(10, 5.0))  # fits, but b came first: no overtaking
    await asyncio.sleep(0.01)
    assert (budget.in_flight, budget.waiting) == (60, 2)
    assert not waiting_b.done() and not waiting_c.done()
    a.release()
    a.release()  # idempotent
    await asyncio.wait_for(asyncio.gather(waiting_b, waiting_c), 1.0)
    assert budget.in_flight == 70 and budget.peak == 70
    b.release()
    c.release()
    assert budget.in_flight == 0


async def test_more_than_the_whole_budget_is_refused_at_once() -> None:
    budget = PixelBudget(100)
    with pytest.raises(MediaRejectedError) as info:
        await budget.lease().acquire(101, 5.0)
    assert (info.value.status_code, info.value.code) == (400, "image_too_large")
    assert "--max-image-pixels-in-flight" in info.value.message
    assert budget.in_flight == 0


async def test_a_wait_past_its_limit_is_a_503_and_leaks_nothing() -> None:
    budget = PixelBudget(100)
    holder = budget.lease()
    await holder.acquire(90, 1.0)
    late = budget.lease()
    with pytest.raises(MediaBusyError) as info:
        await late.acquire(20, 0.05)
    assert info.value.status_code == 503
    assert (budget.in_flight, budget.waiting, late.pixels) == (90, 0, 0)
    # A cancelled waiter leaves no trace either, and a small one behind it is not blocked.
    big = asyncio.create_task(budget.lease().acquire(50, 5.0))
    await asyncio.sleep(0.01)
    small = budget.lease()
    small_wait = asyncio.create_task(small.acquire(10, 5.0))
    await asyncio.sleep(0.01)
    assert not small_wait.done()  # behind the big one
    big.cancel()
    await asyncio.wait_for(small_wait, 1.0)
    assert budget.in_flight == 100 and budget.waiting == 0
    holder.release()
    small.release()
    assert budget.in_flight == 0


async def test_zero_is_unbounded_and_the_default_is_two_largest_images() -> None:
    budget = PixelBudget(0)
    await budget.lease().acquire(10**12, 0.01)
    assert create_pixel_budget(MediaConfig(max_image_pixels=1000)).capacity == 2000
    assert create_pixel_budget(MediaConfig(max_image_pixels_in_flight=5)).capacity == 5


def bomb(side: int, seed: int) -> str:
    """A side x side 1-bit PNG (a few KB) as a data URL; each seed a different image."""
    image = Image.new("1", (side, side))
    image.putpixel((seed % side, seed // side % side), 1)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def message(*urls: str) -> list[dict[str, object]]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "hi"}]}]


async def test_concurrent_bombs_never_hold_more_than_the_budget() -> None:
    side = 1500  # 2.25 MP each; two fit in the budget at once
    config = MediaConfig(max_image_pixels=side * side, media_fetch_timeout=30.0)
    budget = PixelBudget(2 * side * side)
    assert len(bomb(side, 1)) < 4000
    seen: list[int] = []
    metrics = MediaMetrics()

    async def request(seed: int) -> int:
        lease = budget.lease()
        try:
            images = await load_chat_images(
                message(bomb(side, seed)),
                client=client,
                config=config,
                cache=MediaCache(0),
                metrics=metrics,
                pixels=lease,
            )
            seen.append(budget.in_flight)
            await asyncio.sleep(random.uniform(0.0, 0.05))  # the response streams
            return len(images)
        finally:
            lease.release()

    async with httpx.AsyncClient() as client:
        requests = asyncio.gather(*(request(s) for s in range(10)))
        results = await asyncio.wait_for(requests, 60)
    assert results == [1] * 10
    assert budget.peak == 2 * side * side  # it was full, never more
    assert max(seen) <= budget.capacity and budget.in_flight == 0
    assert metrics.images_decoded == 10


async def test_a_request_over_the_whole_budget_is_a_400_before_decoding() -> None:
    config = MediaConfig(max_image_pixels=1000 * 1000)
    budget = PixelBudget(1500 * 1000)
    metrics = MediaMetrics()
    with pytest.raises(MediaRejectedError) as info:
        await load_chat_images(
            message(bomb(1000, 1), bomb(1000, 2)),
            client=httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500))),
            config=config,
            cache=MediaCache(0),
            metrics=metrics,
            pixels=budget.lease(),
        )
    assert info.value.param == "messages" and info.value.code == "image_too_large"
    assert metrics.images_decoded == 0 and budget.in_flight == 0
    assert metrics.fetches[("data", "rejected")] == 2


async def test_a_release_between_a_cancel_and_its_cleanup_skips_the_cancelled() -> None:
    budget = PixelBudget(100)
    holder = budget.lease()
    await holder.acquire(100, 1.0)
    first, second = budget.lease(), budget.lease()
    a = asyncio.create_task(first.acquire(50, 5.0))
    b = asyncio.create_task(second.acquire(50, 5.0))
    await asyncio.sleep(0.01)
    a.cancel()  # its future is cancelled now; its except block runs on its next turn
    holder.release()  # in between: must not grant the cancelled waiter
    await asyncio.wait_for(b, 1.0)
    with pytest.raises(asyncio.CancelledError):
        await a
    assert (budget.in_flight, budget.waiting, first.pixels, second.pixels) == (50, 0, 0, 50)
    second.release()
    assert budget.in_flight == 0


async def test_a_thin_image_reserves_the_pixels_it_will_be_resized_to() -> None:
    """Issue 40 item 5: the budget counts an image as the model's processor will make it (its
    shortest edge resized to EngineInfo.image_resize_edge), not by its few pixels on the wire."""
    image = Image.new("1", (4, 800))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    budget = PixelBudget(10**6)
    lease = budget.lease()
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    got = await load_chat_images(
        message(url),
        client=client,
        config=MediaConfig(),
        cache=MediaCache(0),
        pixels=lease,
        resize_edge=32,
    )
    assert got[0].payload.size == (4, 800)  # type: ignore[attr-defined]
    assert lease.pixels == budget.in_flight == 32 * 6_400
    lease.release()
    thin = Image.new("1", (1, 300_000))
    buf = io.BytesIO()
    thin.save(buf, format="PNG", optimize=True)
    assert len(buf.getvalue()) < 2_000
    with pytest.raises(MediaRejectedError) as info:
        await load_chat_images(
            message("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()),
            client=client,
            config=MediaConfig(),
            cache=MediaCache(0),
            pixels=budget.lease(),
            resize_edge=32,
        )
    assert info.value.code == "image_aspect_ratio"
    assert info.value.param == "messages[0].content[0].image_url"
    assert budget.in_flight == 0


async def test_api_servers_share_one_budget(tmp_path: Path) -> None:
    """--api-server-count N: two budgets on one counts file stand for two API servers (each
    maps the file and locks it on its own descriptor): together they hold at most the budget,
    room one gives back reaches the other's waiter, and every gauge is both servers'."""
    path = str(tmp_path / "counts")
    SharedCounts.create(path, servers=2)
    one, two = PixelBudget(100, SharedCounts(path)), PixelBudget(100, SharedCounts(path))
    held = one.lease()
    await held.acquire(80, 1.0)
    waiting = asyncio.create_task(two.lease().acquire(50, 5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # 80 + 50 > 100 across the two servers
    for budget in (one, two):
        assert (budget.in_flight, budget.peak, budget.waiting) == (80, 80, 1)
    held.release()  # in the other server: nothing wakes `two` but its own look
    await asyncio.wait_for(waiting, 1.0)
    for budget in (one, two):
        assert (budget.in_flight, budget.peak, budget.waiting) == (50, 80, 0)
    late = one.lease()
    with pytest.raises(MediaBusyError):
        await late.acquire(60, 0.1)  # 50 + 60 > 100: a 503 after its wait, nothing leaked
    assert (one.in_flight, one.waiting) == (50, 0)
