"""Grammar builds off the step loop on the built-in engine (issue 24 item 4): the deadline, an
abort while a build runs, and a plain request that steps while a bomb compiles."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest

from tests.engine.conftest import EngineFactory, collect, greedy
from tests.in_thread import thread_core
from trtllm_gateway.engine.protocol import GenerateRequest, GuidedDecoding, InvalidRequestError


async def until(cond: Callable[[], bool], wait_s: float = 10.0) -> bool:
    """Poll the core's state (it has no event to wait on) until cond() or wait_s passes."""
    for _ in range(int(wait_s / 0.005)):
        if cond():
            return True
        await asyncio.sleep(0.005)
    return cond()


async def test_a_build_past_the_deadline_is_a_400_and_the_engine_goes_on(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine(grammar_compile_timeout=0.01)
    prompt = tuple(chat_prompts[0])
    bomb = greedy(4, guided=GuidedDecoding("regex", "q{1000000}"))
    with pytest.raises(InvalidRequestError) as exc:
        await collect(engine, GenerateRequest("slow", prompt, bomb))
    assert exc.value.param == "structured_outputs.regex"
    assert "--grammar-compile-timeout" in str(exc.value)
    # The id is free again at once, though the late build may still run.
    plain = await collect(engine, GenerateRequest("slow", prompt, greedy(3)))
    assert sum(len(ev.token_ids) for ev in plain) == 3
    assert engine.health().state == "ready"


async def test_abort_while_the_grammar_builds(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    core = thread_core(engine)
    prompt = tuple(chat_prompts[0])
    bomb = greedy(4, guided=GuidedDecoding("regex", "r{1000000}"))
    consumer = asyncio.ensure_future(collect(engine, GenerateRequest("gone", prompt, bomb)))
    # It waits for its matcher outside the scheduler.
    assert await until(lambda: "gone" in core._constraining)
    consumer.cancel()  # the client goes away: generate aborts the request
    with contextlib.suppress(asyncio.CancelledError):
        await consumer
    assert await until(lambda: not core._constraining and "gone" not in core._st.seqs)
    assert core._guided is not None and not core._guided.pending()
    plain = await collect(engine, GenerateRequest("after", prompt, greedy(2)))
    assert sum(len(ev.token_ids) for ev in plain) == 2


async def test_plain_requests_step_while_a_bomb_compiles(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    core = thread_core(engine)
    prompt = tuple(chat_prompts[1])
    bombs = [
        asyncio.ensure_future(
            collect(engine, GenerateRequest(f"b{c}", prompt, greedy(4, guided=g)))
        )
        for c, g in [(c, GuidedDecoding("regex", f"{c}{{1000000}}")) for c in "stuv"]
    ]
    started = time.monotonic()
    plain = await collect(engine, GenerateRequest("plain", prompt, greedy(6)))
    plain_s = time.monotonic() - started
    pending_then = len(core._constraining)
    results = await asyncio.gather(*bombs, return_exceptions=True)
    assert all(isinstance(r, InvalidRequestError) for r in results), results
    assert sum(len(ev.token_ids) for ev in plain) == 6
    # The plain request finished while at least one bomb was still compiling off the loop.
    assert pending_then >= 1, f"every bomb was built before a 6-token request ended ({plain_s})"


async def test_a_constraint_built_before_skips_the_worker(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    core = thread_core(engine)
    worker = core._guided
    assert worker is not None
    submitted: list[str] = []
    submit = worker.submit

    def counting(request_id: str, guided: GuidedDecoding) -> None:
        submitted.append(request_id)
        submit(request_id, guided)

    worker.submit = counting  # type: ignore[method-assign]
    prompt = tuple(chat_prompts[2])
    sp = greedy(6, guided=GuidedDecoding("regex", "(yes|no) [0-9]{2}"))
    first = await collect(engine, GenerateRequest("first", prompt, sp))
    second = await collect(engine, GenerateRequest("second", prompt, sp))
    assert submitted == ["first"]  # the second copied the template in the step loop
    tokens = [[t for ev in events for t in ev.token_ids] for events in (first, second)]
    assert tokens[0] == tokens[1] and tokens[0]
