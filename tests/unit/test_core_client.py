"""CoreClient over a thread, against a scripted core (no torch): the whole wire path but spawn.

The real model over a spawned process is tests/engine/test_core_process.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest

from tests.unit.kv_arena import ScriptedArena
from trtllm_gateway.engine.disagg import kv_wire
from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    DisaggParams,
    EngineDeadError,
    EngineHealth,
    EngineInfo,
    GenerateRequest,
    InvalidRequestError,
    SamplingParams,
    TokenEvent,
    Usage,
)
from trtllm_gateway.engine.transport import messages as m
from trtllm_gateway.engine.transport.client import CoreClient
from trtllm_gateway.engine.transport.inproc import ThreadLauncher

BOOM = 666  # a prompt token that makes the scripted step raise (an engine bug)


class ScriptedCore:
    """One token a step per request: token = 100 + position; prompt [BOOM] breaks the step."""

    steps_on_cpu = False  # a scripted step takes no time: nothing to yield the GIL for

    def __init__(self) -> None:
        self.stopping = False
        self.live: dict[str, list[int]] = {}  # request id -> [produced, max_tokens, prompt_len]
        self.out: list[tuple[str, TokenEvent]] = []
        self.errors: list[tuple[str, m.RequestError]] = []
        self.added: list[m.Add] = []
        self.blobs: dict[str, bytes | None] = {}
        self.breaks = False
        self.arena = ScriptedArena()

    def load(self, progress: Callable[[str], None]) -> m.Ready:
        progress("scripted loading")
        return m.Ready(EngineInfo("scripted", 64, 1000, (2,)), "/nowhere", self._health())

    wake_fd = None

    def handle(self, msg: m.Inbound, frames: list[bytes]) -> tuple[m.Reply, bytes | None] | None:
        if isinstance(msg, m.Add):
            self.added.append(msg)
            self.blobs[msg.request_id] = frames[0] if frames else None
            n = len(msg.prompt_token_ids)
            if n + msg.sampling.max_tokens > 64:
                self.errors.append(
                    (
                        msg.request_id,
                        m.RequestError.of(ContextTooLongError(n, msg.sampling.max_tokens, 64)),
                    )
                )
            else:
                self.breaks |= msg.prompt_token_ids == (BOOM,)
                self.live[msg.request_id] = [0, msg.sampling.max_tokens, n]
        elif isinstance(msg, m.Abort):
            state = self.live.pop(msg.request_id, None)
            if state is not None:
                self.out.append((msg.request_id, self._final((), "abort", state)))
        elif isinstance(msg, m.ExportKv):
            if msg.request_id == "held":
                return m.Reply(msg.cookie, kv=self.arena.stage(b"kv-bytes")), None
            return m.Reply(msg.cookie, m.RequestError("invalid", "no KV held")), None
        elif isinstance(msg, m.ReleaseKv):
            self.arena.released.append(msg.request_id)
        elif isinstance(msg, m.Stop):
            self.stopping = True
            self.arena.close()
            for rid in list(self.live):
                self.out.append((rid, self._final((), "abort", self.live.pop(rid))))
        return None

    def has_work(self) -> bool:
        return bool(self.live)

    def idle_timeout(self) -> float | None:
        return None

    def step(self) -> None:
        if self.breaks:
            raise RuntimeError("scripted engine bug")
        time.sleep(0.002)  # a step takes time, as a real one does
        for rid, state in list(self.live.items()):
            state[0] += 1
            token = (100 + state[0],)
            if state[0] >= state[1]:
                del self.live[rid]
                self.out.append((rid, self._final(token, "length", state)))
            else:
                self.out.append((rid, TokenEvent(token)))

    def batch(self) -> m.OutputBatch:
        out, errors, self.out, self.errors = self.out, self.errors, [], []
        return m.OutputBatch(out, errors, self._health())

    def cached_prefix_tokens(self, prompt_token_ids: tuple[int, ...]) -> int:
        return len(prompt_token_ids) // 2

    def _final(self, token: tuple[int, ...], reason: str, state: list[int]) -> TokenEvent:
        return TokenEvent(
            token,
            None,
            finish_reason=reason,  # type: ignore[arg-type]
            usage=Usage(state[2], state[0]),
        )

    def _health(self) -> EngineHealth:
        return EngineHealth(state="ready", running=len(self.live))


CORES: list[ScriptedCore] = []


def scripted() -> ScriptedCore:
    CORES.append(ScriptedCore())
    return CORES[-1]


@pytest.fixture
async def client() -> AsyncIterator[CoreClient]:
    c = CoreClient(ThreadLauncher(scripted), "scripted", 16)
    await c.start()
    yield c
    await c.stop()


def req(rid: str, prompt: tuple[int, ...] = (1, 2, 3), max_tokens: int = 4) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_tokens=max_tokens))


class SlowLoadingCore(ScriptedCore):
    """Reports two stages of a load and holds in the second until released."""

    release = threading.Event()

    def load(self, progress: Callable[[str], None]) -> m.Ready:
        progress("loading the model")
        progress("building CPU kernels")
        self.release.wait(10)
        return super().load(progress)


async def test_health_says_what_a_loading_core_is_doing() -> None:
    """The core's Loading messages reach health's detail before Ready (#23: a slow first
    start says it is building CPU kernels), and Ready clears it."""
    c = CoreClient(ThreadLauncher(SlowLoadingCore), "scripted", 16)
    starting = asyncio.create_task(c.start())
    try:
        for _ in range(200):
            if c.health().detail == "building CPU kernels":
                break
            await asyncio.sleep(0.01)
        assert c.health().state == "loading"
        assert c.health().detail == "building CPU kernels"
        SlowLoadingCore.release.set()
        await asyncio.wait_for(starting, 10)
        assert c.health().state == "ready" and c.health().detail == ""
    finally:
        SlowLoadingCore.release.set()
        await c.stop()


async def test_streams_fan_out_to_their_requests(client: CoreClient) -> None:
    assert client.info.model_id == "scripted" and client.tokenizer_dir == "/nowhere"
    assert client.health().state == "ready"

    async def run(rid: str, n: int) -> list[int]:
        return [t async for ev in client.generate(req(rid, max_tokens=n)) for t in ev.token_ids]

    a, b = await asyncio.gather(run("a", 3), run("b", 6))
    assert a == [101, 102, 103]
    assert b == [101, 102, 103, 104, 105, 106]
    await asyncio.sleep(0.05)
    assert client.health().running == 0


async def test_closing_a_stream_aborts_it_in_the_core(client: CoreClient) -> None:
    gen = client.generate(req("x", max_tokens=50))
    first = await gen.__anext__()
    assert first.token_ids
    await gen.aclose()
    for _ in range(100):
        if client.health().running == 0:
            break
        await asyncio.sleep(0.01)
    assert client.health().running == 0


async def test_errors_arrive_as_engine_errors_before_the_first_event(client: CoreClient) -> None:
    with pytest.raises(ContextTooLongError) as exc:
        async for _ in client.generate(req("long", max_tokens=100)):
            pass
    assert exc.value.max_model_len == 64
    huge = GenerateRequest("huge", (1,), SamplingParams(seed=2**70))
    with pytest.raises(InvalidRequestError, match="seed") as exc:
        async for _ in client.generate(huge):
            pass
    assert exc.value.param == "seed"
    huge_id = GenerateRequest("huge2", (1,), SamplingParams(stop_token_ids=(2**70,)))
    with pytest.raises(InvalidRequestError, match="out of range"):
        async for _ in client.generate(huge_id):
            pass
    # Images on a model without them are the core's refusal (one admission, in the core):
    # tests/engine/test_llava.py::test_text_only_model_refuses_images, through the messages.


async def test_kv_handoff_and_probe(client: CoreClient) -> None:
    """pull_kv (protocol v1) reads the staged region in place into a kv_wire blob, then frees
    it; stage_kv only says where it is."""
    core = CORES[-1]
    header, data = kv_wire.decode(await client.pull_kv("held"))
    assert bytes(data) == b"kv-bytes" and header.shape == (1, 2, 1, 1, 1)
    await asyncio.sleep(0.05)
    assert core.arena.released == ["held"]
    region = await client.stage_kv("held")
    assert bytes(client.kv_view(region)) == b"kv-bytes"
    with pytest.raises(InvalidRequestError, match="no KV held"):
        await client.pull_kv("other")
    assert client.cached_prefix_tokens(tuple(range(10))) == 5
    disagg = DisaggParams("generation_only", first_token_ids=(7,), kv_payload=b"blob")
    r = GenerateRequest("dec", (1, 2), SamplingParams(max_tokens=2), disagg=disagg)
    assert [ev async for ev in client.generate(r)][-1].finish_reason == "length"
    assert core.blobs["dec"] == b"blob"  # the KV went as its own frame
    assert core.added[-1].first_token_ids == (7,)


async def test_prefill_holds_kv(client: CoreClient) -> None:
    result = await client.prefill(req("ctx", max_tokens=9))
    assert result.first_token_ids == (101,)
    assert result.prompt_tokens == 3


async def drain(gen: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    async with contextlib.aclosing(gen):
        return [ev async for ev in gen]


async def test_a_dead_core_fails_open_streams_and_health() -> None:
    c = CoreClient(ThreadLauncher(ScriptedCore), "scripted", 16)
    await c.start()
    try:
        victim = c.generate(req("victim", max_tokens=60))
        await victim.__anext__()
        with pytest.raises(EngineDeadError, match="scripted engine bug"):
            await drain(c.generate(req("boom", prompt=(BOOM,))))
        with pytest.raises(EngineDeadError, match="scripted engine bug"):
            await drain(victim)
        h = c.health()
        assert h.state == "dead" and "scripted engine bug" in h.detail
        with pytest.raises(EngineDeadError):
            await drain(c.generate(req("after")))
    finally:
        await c.stop()


async def test_stop_ends_open_streams_with_abort() -> None:
    c = CoreClient(ThreadLauncher(ScriptedCore), "scripted", 16)
    await c.start()
    gen = c.generate(req("open", max_tokens=60))
    await gen.__anext__()
    await c.stop()
    events = [ev async for ev in gen]
    assert events[-1].finish_reason == "abort"
    assert c.health().state == "draining"


class CopyingCore(ScriptedCore):
    """Request "copying" makes no token: its KV copy is in flight until `copied` is set, and an
    abort is answered only then (as kv_handoffs.KvHandoffs answers one mid-load)."""

    copied = threading.Event()

    def __init__(self) -> None:
        super().__init__()
        self.aborted_mid_copy: list[int] = []  # the abort's usage state, answered after the copy

    def handle(self, msg: m.Inbound, frames: list[bytes]) -> tuple[m.Reply, bytes | None] | None:
        if isinstance(msg, m.Abort) and msg.request_id == "copying":
            self.aborted_mid_copy = self.live.pop("copying", [0, 0, 0])
            return None
        return super().handle(msg, frames)

    def has_work(self) -> bool:
        return super().has_work() or bool(self.aborted_mid_copy)

    def step(self) -> None:
        copying = self.live.pop("copying", None)
        super().step()
        if copying is not None:
            self.live["copying"] = copying
        if self.aborted_mid_copy and self.copied.is_set():
            self.out.append(("copying", self._final((), "abort", self.aborted_mid_copy)))
            self.aborted_mid_copy = []


async def test_an_abort_mid_copy_settles_only_with_the_cores_last_word() -> None:
    """remote_prefill frees the region a decode request's KV is copied from once the core has
    settled the request (capabilities.AbortSettling): a client gone before the first event must
    not free it under the copy."""
    CopyingCore.copied.clear()
    c = CoreClient(ThreadLauncher(CopyingCore), "scripted", 16)
    await c.start()
    try:
        settled: list[str] = []
        gen = c.generate(req("copying", max_tokens=8))
        first = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.1)
        first.cancel()  # the client is gone before any event
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await gen.aclose()
        c.when_settled("copying", lambda: settled.append("copying"))
        await asyncio.sleep(0.2)
        assert settled == []  # the copy is still in flight
        # Nothing outstanding: at once (a request that finished, or one never sent).
        assert [ev async for ev in c.generate(req("done", max_tokens=2))][-1].finish_reason
        c.when_settled("done", lambda: settled.append("done"))
        c.when_settled("unknown", lambda: settled.append("unknown"))
        assert settled == ["done", "unknown"]
        CopyingCore.copied.set()
        for _ in range(200):
            if "copying" in settled:
                break
            await asyncio.sleep(0.01)
        assert settled == ["done", "unknown", "copying"]
        # A second abort of it mid-copy, then the core stops: settled by the stop.
        CopyingCore.copied.clear()
        gen = c.generate(req("copying", max_tokens=8))
        first = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.1)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await gen.aclose()
        c.when_settled("copying", lambda: settled.append("stopped"))
    finally:
        CopyingCore.copied.set()
        await c.stop()
    assert settled[-1] == "stopped"
