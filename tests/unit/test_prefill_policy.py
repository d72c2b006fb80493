"""Issue 41 item 5, the pieces alone: BusyPolicy (retry or prefill locally when every prefill
sibling is busy), KvRoom (KV blocks a decode instance promises to remote prefills before it
sends them), PrefillQueue (a prefill instance's bound on queued prompt tokens, its 503 with the
queue)."""

from __future__ import annotations

import asyncio
import time

import pytest

from trtllm_gateway.engine.disagg.kv_room import KvRoom, block_size_of
from trtllm_gateway.engine.disagg.prefill_policy import BusyPolicy, least_queued
from trtllm_gateway.engine.disagg.sibling_wire import QueueReport as Queue
from trtllm_gateway.engine.protocol import EngineHealth
from trtllm_gateway.web.errors import ServiceUnavailableError
from trtllm_gateway.web.prefill_queue import PrefillQueue

POLICY = BusyPolicy(local_factor=8.0, retries=3)


def test_a_short_queue_is_waited_out_with_doubling_waits() -> None:
    q = [Queue(2, 4096)]  # 4,096 queued <= 8 x 2,048 uncached: worth waiting for
    waits = [POLICY.wait_before_retry(2048, q, retry) for retry in (1, 2, 3)]
    assert waits == [0.1, 0.2, 0.4]
    assert POLICY.wait_before_retry(2048, q, 4) is None  # retries spent: local


def test_a_queue_past_the_factor_goes_local_at_once() -> None:
    assert POLICY.wait_before_retry(2048, [Queue(9, 16385)], 1) is None
    assert POLICY.wait_before_retry(2048, [Queue(8, 16384)], 1) == 0.1  # at the bound: wait
    # The least-queued sibling decides: one sibling with a short queue is worth a retry.
    assert POLICY.wait_before_retry(2048, [Queue(9, 90000), Queue(1, 1000)], 1) == 0.1
    # A short prompt is cheap here: the same queue sends it local.
    assert POLICY.wait_before_retry(256, [Queue(1, 4096)], 1) is None


def test_an_unknown_queue_is_retried_and_waits_stay_within_retry_after() -> None:
    unknown = [Queue(None, None)]  # an older sibling's 503 says nothing
    assert POLICY.wait_before_retry(2048, unknown, 1) == 0.1
    assert least_queued(unknown) is None
    assert BusyPolicy(8.0, 10).wait_before_retry(2048, unknown, 8) == 1.0  # capped at 1 s
    assert POLICY.wait_before_retry(2048, unknown, 3, retry_after=0.25) == 0.25
    assert BusyPolicy(8.0, 0).wait_before_retry(2048, unknown, 1) is None  # no retries


def test_block_size_comes_from_the_builtin_layout_only() -> None:
    assert block_size_of("llama:30x3x64:torch.float32:bs16") == 16
    assert block_size_of("trtllm:/m:kv=auto:block=32") is None


class Health:
    def __init__(self, total: int, active: int) -> None:
        self.total, self.active = total, active

    def __call__(self) -> EngineHealth:
        return EngineHealth("ready", kv_active_blocks=self.active, kv_total_blocks=self.total)


async def test_room_is_reserved_against_free_blocks_and_released_once() -> None:
    health = Health(total=10, active=4)  # 6 free blocks of 16 tokens
    room = KvRoom(health, 16)
    a = room.try_reserve(64)  # 4 blocks
    assert a is not None and a.blocks == 4 and room.reserved == 4
    assert room.try_reserve(48) is None  # 3 more do not fit in the 2 left
    b = room.try_reserve(17)  # 2 blocks
    assert b is not None and room.free() == 0
    a.release()
    a.release()  # idempotent
    assert room.reserved == 2 and room.free() == 4


async def test_a_waiter_gets_room_when_a_reservation_ends_or_times_out() -> None:
    health = Health(total=8, active=0)
    room = KvRoom(health, 16)
    held = room.try_reserve(128)  # all 8 blocks
    assert held is not None
    waiter = asyncio.create_task(room.reserve(32, wait_s=5.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()  # no room: it waits, it does not send
    held.release()
    got = await asyncio.wait_for(waiter, 1.0)
    assert got is not None and got.blocks == 2
    health.active = 8  # the engine's own requests took every block
    t0 = time.monotonic()
    assert await room.reserve(32, wait_s=0.2) is None
    assert 0.15 < time.monotonic() - t0 < 1.0


def test_unknown_blocks_and_oversized_prompts_need_no_room() -> None:
    assert KvRoom(Health(0, 0), 16).try_reserve(10**6) is not None  # no snapshot yet
    assert KvRoom(Health(10, 10), None).try_reserve(64) is not None  # TensorRT-LLM
    big = KvRoom(Health(10, 10), 16).try_reserve(16 * 11)  # larger than the whole cache
    assert big is not None and big.blocks == 0  # the engine refuses it, nothing to wait for


def test_the_prefill_queue_refuses_past_its_bound_with_the_queue() -> None:
    queue = PrefillQueue(max_tokens=4096)
    first = queue.enter(5000)  # an idle instance takes any prompt
    with pytest.raises(ServiceUnavailableError) as exc:
        queue.enter(10)
    assert exc.value.headers == {"X-Prefill-Queue-Requests": "1", "X-Prefill-Queue-Tokens": "5000"}
    assert exc.value.code == "prefill_queue_full" and queue.refused == 1
    first.release()
    first.release()  # idempotent
    second, third = queue.enter(2048), queue.enter(2048)
    assert (queue.requests, queue.tokens) == (2, 4096)
    with pytest.raises(ServiceUnavailableError):
        queue.enter(1)
    second.release()
    third.release()
    assert (queue.requests, queue.tokens) == (0, 0)
    unbounded = PrefillQueue(None)
    for _ in range(100):
        unbounded.enter(10**6)
