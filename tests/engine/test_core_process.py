"""The engine core in its own process (production), on the real model (SmolLM2-135M, fp32, CPU).

Every other engine test runs the same core and messages in a thread (--no-engine-process); here
what only the process launcher has: the same tokens and logprobs as the thread, images across
the process boundary, disaggregation across two core processes through shared memory, and
failure: the core killed mid-stream fails the stream at once and leaves health dead; the gateway
killed leaves no orphan core.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import replace
from typing import Any

import psutil
import pytest

from tests.configs import builtin_core_client
from tests.engine.conftest import EngineFactory, greedy
from trtllm_gateway.engine.kv_region import KvPayload
from trtllm_gateway.engine.protocol import (
    DisaggParams,
    EngineDeadError,
    GenerateRequest,
    InvalidRequestError,
    TokenEvent,
)
from trtllm_gateway.engine.transport.client import CoreClient

CoreFactory = Callable[..., Coroutine[Any, Any, CoreClient]]


def core_client(**overrides: Any) -> CoreClient:
    return builtin_core_client(**{"dtype": "float32", "device": "cpu", **overrides})


@pytest.fixture
async def make_core() -> AsyncIterator[CoreFactory]:
    clients: list[CoreClient] = []

    async def factory(**overrides: Any) -> CoreClient:
        client = core_client(**overrides)
        clients.append(client)
        await client.start()
        return client

    yield factory
    for c in clients:
        h = c.health()
        assert h.state == "dead" or (h.running == 0 and h.waiting == 0), h
        await c.stop()
        assert c.launcher.exitcode is not None  # the core process is gone


async def collect(engine: Any, req: GenerateRequest) -> list[TokenEvent]:
    return await drain(engine.generate(req))


async def drain(gen: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    async with contextlib.aclosing(gen):  # type: ignore[type-var]
        return [ev async for ev in gen]


def tokens(events: list[TokenEvent]) -> list[int]:
    return [t for ev in events for t in ev.token_ids]


async def test_same_tokens_and_logprobs_as_in_a_thread(
    make_core: CoreFactory, make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    core = await make_core()
    inproc = await make_engine()
    assert core.info == inproc.info
    reqs = [
        GenerateRequest(f"r{i}", tuple(ids), greedy(24, logprobs=2))
        for i, ids in enumerate(chat_prompts)
    ]
    # All at once: the core batches them, as the in-process engine does.
    got = await asyncio.gather(*(collect(core, r) for r in reqs))
    want = await asyncio.gather(*(collect(inproc, r) for r in reqs))
    for g, w in zip(got, want, strict=True):
        assert tokens(g) == tokens(w)
        glp = [lp.logprob for ev in g for lp in ev.logprobs or ()]
        wlp = [lp.logprob for ev in w for lp in ev.logprobs or ()]
        assert max(abs(a - b) for a, b in zip(glp, wlp, strict=True)) < 1e-4
        # cached_tokens depends on which requests shared a step (a prefix is cached only once
        # an earlier step stored it), which timing decides on either side; the counts do not.
        gu, wu = g[-1].usage, w[-1].usage
        assert gu is not None and wu is not None
        assert (gu.prompt_tokens, gu.completion_tokens) == (wu.prompt_tokens, wu.completion_tokens)
        assert g[-1].finish_reason == w[-1].finish_reason
    assert core.health().prefix_cache_queries >= len(reqs)
    # The core's prefix-cache events reach the client's log (KvEventSource), in order.
    records, lost = core.kv_event_log.since(-1)
    assert not lost and type(records[0].event).__name__ == "AllBlocksCleared"
    assert any(type(r.event).__name__ == "BlockStored" for r in records)
    assert core.kv_event_log.num_blocks > 0


async def test_disaggregation_across_two_core_processes(
    make_core: CoreFactory, chat_prompts: list[list[int]]
) -> None:
    prefill, decode = await asyncio.gather(make_core(block_size=8), make_core(block_size=8))
    req = GenerateRequest("d", tuple(chat_prompts[1]), greedy(16, logprobs=1))
    expected = await collect(decode, replace(req, request_id="agg"))
    res = await prefill.prefill(req)
    assert prefill.health().kv_usage == 0.0  # staged in the core's arena: the blocks are back
    region = await prefill.stage_kv(req.request_id)
    # The decode core (another process) copies straight from the prefill core's shared memory.
    assert region.transport == "shm" and region.arena.lstrip("/") in os.listdir("/dev/shm")
    disagg = DisaggParams(
        "generation_only", res.first_token_ids, res.first_logprobs, "d", None, KvPayload(region)
    )
    events = await collect(decode, replace(req, disagg=disagg))
    assert tokens(events) == tokens(expected)
    prefill.release_kv(req.request_id)
    with pytest.raises(InvalidRequestError):
        await prefill.stage_kv(req.request_id)  # freed once released
    # The prefix cache probe answers from the core without waiting for a step.
    assert decode.cached_prefix_tokens(req.prompt_token_ids) >= 8


async def test_core_killed_mid_stream_fails_the_stream_at_once(
    make_core: CoreFactory, chat_prompts: list[list[int]]
) -> None:
    core = await make_core()
    pid = core.launcher.pid
    assert pid is not None
    gen = core.generate(GenerateRequest("k", tuple(chat_prompts[0]), greedy(400, ignore_eos=True)))
    await gen.__anext__()
    os.kill(pid, signal.SIGKILL)
    t0 = time.perf_counter()
    with pytest.raises(EngineDeadError, match="exited"):
        await drain(gen)
    assert time.perf_counter() - t0 < 5.0  # the sentinel, not a timeout
    h = core.health()
    assert h.state == "dead" and "exited" in h.detail
    with pytest.raises(EngineDeadError):
        await collect(core, GenerateRequest("after", (1, 2), greedy(2)))


_GATEWAY = """
import asyncio, sys
from tests.engine.test_core_process import core_client

async def main():
    c = core_client()
    await c.start()
    print(c.launcher.pid, flush=True)
    await asyncio.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""


def test_no_orphan_core_when_the_gateway_is_killed(tmp_path: Any) -> None:
    script = tmp_path / "gateway.py"
    script.write_text(_GATEWAY)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        core_pid = int(proc.stdout.readline())
        assert psutil.pid_exists(core_pid)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not psutil.pid_exists(core_pid) or psutil.Process(core_pid).status() == "zombie":
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"engine core {core_pid} outlived its gateway")
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_images_in_the_core_process_same_tokens_as_in_a_thread(
    make_core: CoreFactory, make_engine: EngineFactory, tmp_path: Any
) -> None:
    from tests.engine.test_llava import chat_ids, images
    from tests.engine.tiny_llava import build_tiny_llava, sample_images

    model = build_tiny_llava(tmp_path, "llava")
    core = await make_core(model=str(model))
    inproc = await make_engine(model=str(model))
    assert core.info.supports_images
    pils = sample_images()[:2]
    req = GenerateRequest("img", tuple(chat_ids(model, 2)), greedy(10), images=images(*pils))
    got, want = await asyncio.gather(collect(core, req), collect(inproc, req))
    assert tokens(got) == tokens(want) and len(tokens(got)) == 10
    assert got[-1].usage == want[-1].usage  # the prompt as expanded at its image tokens
    # An aborted encode leaves nothing behind; the core still serves.
    gen = core.generate(replace(req, request_id="gone"))
    first = asyncio.ensure_future(gen.__anext__())  # the Add goes out; its images encode
    await asyncio.sleep(0.01)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    await gen.aclose()
    assert tokens(await collect(core, replace(req, request_id="again"))) == tokens(want)
