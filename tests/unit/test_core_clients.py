"""One core, several CoreClients (--api-server-count): the loop's ManyPipes over real ipc://
sockets, against the scripted core of test_core_client.py, in a thread (no spawn, no torch).

The real model behind two API server processes is tests/e2e/test_api_servers.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq

from tests.unit.test_core_client import BOOM, ScriptedCore, drain, req
from trtllm_gateway.engine.disagg import kv_wire
from trtllm_gateway.engine.protocol import EngineDeadError, InvalidRequestError
from trtllm_gateway.engine.transport import messages as m
from trtllm_gateway.engine.transport.attach import AttachedCore
from trtllm_gateway.engine.transport.client import CoreClient
from trtllm_gateway.engine.transport.loop import Addresses, run_core


class SharedCore:
    """run_core in a thread for `count` clients; `code` is its exit status once it ended."""

    def __init__(self, folder: Path, count: int, core: ScriptedCore | None = None) -> None:
        self.addresses = tuple(
            Addresses(f"ipc://{folder}/in-{i}", f"ipc://{folder}/out-{i}", f"ipc://{folder}/p-{i}")
            for i in range(count)
        )
        self.core = core or ScriptedCore()
        self.code: int | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.code = run_core(lambda: self.core, self._ctx, self.addresses)

    def client(self, index: int) -> CoreClient:
        return CoreClient(AttachedCore(None), "scripted", 16, self.addresses[index])

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[SharedCore, CoreClient, CoreClient]]:
    shared = SharedCore(tmp_path, 2)
    a, b = shared.client(0), shared.client(1)
    await asyncio.wait_for(asyncio.gather(a.start(), b.start()), 10)
    yield shared, a, b
    await asyncio.gather(a.stop(), b.stop())
    assert shared.join(5)


async def tokens(client: CoreClient, rid: str, n: int) -> list[int]:
    return [t async for ev in client.generate(req(rid, max_tokens=n)) for t in ev.token_ids]


async def test_each_client_gets_its_own_requests_even_with_the_same_id(
    two: tuple[SharedCore, CoreClient, CoreClient],
) -> None:
    shared, a, b = two
    got = await asyncio.gather(tokens(a, "same", 3), tokens(b, "same", 5), tokens(a, "x", 2))
    assert got == [[101, 102, 103], [101, 102, 103, 104, 105], [101, 102]]
    # Inside the core the ids are qualified by the client's index: unique across servers.
    assert sorted(add.request_id for add in shared.core.added) == ["0/same", "0/x", "1/same"]
    # Every server gets the same batch (pipes.ManyPipes): an error under one server's id
    # reaches that server only, and the other's request of the same id goes on.
    open_b = b.generate(req("dup", max_tokens=5))
    assert (await open_b.__anext__()).token_ids == (101,)
    too_long = req("dup", max_tokens=60, prompt=tuple(range(10)))
    with pytest.raises(InvalidRequestError):
        await drain(a.generate(too_long))
    assert [t for ev in await drain(open_b) for t in ev.token_ids] == [102, 103, 104, 105]
    assert a.cached_prefix_tokens(tuple(range(10))) == 5
    assert b.cached_prefix_tokens(tuple(range(4))) == 2
    # Both see the one core's health (the running batch is the core's, not per client).
    held = b.generate(req("held", max_tokens=60))
    await held.__anext__()
    for _ in range(100):
        if a.health().running == 1:
            break
        await asyncio.sleep(0.01)
    assert a.health().running == 1
    await held.aclose()


async def test_one_client_stopping_leaves_the_other_serving(tmp_path: Path) -> None:
    shared = SharedCore(tmp_path, 2)
    a, b = shared.client(0), shared.client(1)
    await asyncio.wait_for(asyncio.gather(a.start(), b.start()), 10)
    open_a = a.generate(req("r", max_tokens=60))
    open_b = b.generate(req("r", max_tokens=30))
    await open_a.__anext__()
    await open_b.__anext__()
    await a.stop()  # drain timed out on server 0: its requests end with abort, b's go on
    assert (await drain(open_a))[-1].finish_reason == "abort"
    assert a.health().state == "draining"
    assert shared.code is None and b.health().state == "ready"
    assert (await drain(open_b))[-1].finish_reason == "length"
    assert await tokens(b, "after", 2) == [101, 102]
    await b.stop()  # the last client: the core stops
    assert shared.join(5) and shared.code == 0


async def test_a_dead_core_fails_every_client(
    two: tuple[SharedCore, CoreClient, CoreClient],
) -> None:
    _, a, b = two
    victim = a.generate(req("victim", max_tokens=60))
    await victim.__anext__()
    with pytest.raises(EngineDeadError, match="scripted engine bug"):
        await drain(b.generate(req("boom", prompt=(BOOM,))))
    with pytest.raises(EngineDeadError, match="scripted engine bug"):
        await drain(victim)
    assert a.health().state == b.health().state == "dead"


class HoldingCore(ScriptedCore):
    """Holds the KV of every hold_kv Add (a context phase) until exported or released."""

    def handle(self, msg: m.Inbound, frames: list[bytes]) -> tuple[m.Reply, bytes | None] | None:
        if isinstance(msg, m.Add) and msg.hold_kv:
            super().handle(msg, frames)
            self.blobs[msg.request_id] = msg.request_id.encode()
            return None
        if isinstance(msg, m.ExportKv):  # the region stays staged until the ReleaseKv
            blob = self.blobs.get(msg.request_id, None)
            if blob is None:
                return m.Reply(msg.cookie, m.RequestError("invalid", "no KV held")), None
            return m.Reply(msg.cookie, kv=self.arena.stage(blob)), None
        if isinstance(msg, m.ReleaseKv):
            self.blobs.pop(msg.request_id, None)
        if isinstance(msg, m.RenewKv):
            self.renewed.append(msg.request_id)
            return None
        return super().handle(msg, frames)

    def __init__(self) -> None:
        super().__init__()
        self.renewed: list[str] = []


async def test_held_kv_is_pulled_through_any_client(tmp_path: Path) -> None:
    """A prefill sibling's context phase ran on one server; the decode side's pull (another HTTP
    request) may land on the other."""
    shared = SharedCore(tmp_path, 2, HoldingCore())
    a, b = shared.client(0), shared.client(1)
    await asyncio.wait_for(asyncio.gather(a.start(), b.start()), 10)
    try:
        await a.prefill(req("ctx"))
        _, data = kv_wire.decode(await b.pull_kv("ctx"))  # held under server 0's qualified id
        assert bytes(data).rstrip(b"\0") == b"0/ctx"
        await asyncio.sleep(0.1)  # b's ReleaseKv and a's ExportKv come through different pipes
        with pytest.raises(InvalidRequestError, match="no KV held"):
            await a.pull_kv("ctx")  # pulled once
        await b.prefill(req("other"))
        a.release_kv("other")
        await asyncio.sleep(0.1)  # a's ReleaseKv and b's ExportKv come through different pipes
        with pytest.raises(InvalidRequestError, match="no KV held"):
            await b.pull_kv("other")
    finally:
        await asyncio.gather(a.stop(), b.stop())
    assert shared.join(5)


async def test_a_lease_renewed_through_any_client_reaches_the_holder(tmp_path: Path) -> None:
    """Issue 41 item 5: the renewal (RenewKv) finds the KV under the holding server's qualified
    id, from whichever server the decode side's call lands on, and leaves it to be pulled."""
    core = HoldingCore()
    shared = SharedCore(tmp_path, 2, core)
    a, b = shared.client(0), shared.client(1)
    await asyncio.wait_for(asyncio.gather(a.start(), b.start()), 10)
    try:
        await a.prefill(req("ctx"))
        b.renew_kv("ctx")
        a.renew_kv("ctx")
        for _ in range(100):  # two inboxes: the renewals arrive in either order
            if len(core.renewed) == 2:
                break
            await asyncio.sleep(0.05)
        assert core.renewed == ["0/ctx", "0/ctx"]
        _, data = kv_wire.decode(await b.pull_kv("ctx"))  # still held after two renewals
        assert bytes(data).rstrip(b"\0") == b"0/ctx"
    finally:
        await asyncio.gather(a.stop(), b.stop())
    assert shared.join(5)


def test_drain_reads_the_inboxes_the_poll_found_ready(tmp_path: Path) -> None:
    """ManyPipes.drain(ready=...) reads only the inboxes the loop's poll reported (the others
    would each cost a receive raising zmq.Again), and every message of those; None reads all."""
    from trtllm_gateway.engine.transport.pipes import ManyPipes

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    addrs = [(f"ipc://{tmp_path}/in-{i}", f"ipc://{tmp_path}/out-{i}") for i in range(3)]
    senders, outs = [], []
    for inbox, outbox in addrs:
        push = ctx.socket(zmq.PUSH)
        push.bind(inbox)
        pull = ctx.socket(zmq.PULL)
        pull.bind(outbox)
        senders.append(push)
        outs.append(pull)
    pipes = ManyPipes(ctx, addrs)
    seen: list[str] = []

    class Core:
        def handle(self, msg: m.Inbound, frames: list[bytes]) -> None:
            assert isinstance(msg, m.Abort)
            seen.append(msg.request_id)

        def batch(self) -> m.OutputBatch:
            raise AssertionError("not asked for")

    core = Core()
    for i in (0, 2):
        for k in range(2):
            senders[i].send(m.encode(m.Abort(f"r{k}")))
    poller = zmq.Poller()
    for inbox in pipes.inboxes:
        poller.register(inbox, zmq.POLLIN)
    deadline = time.monotonic() + 10
    ready: dict[object, int] = {}
    while len(ready) < 2 and time.monotonic() < deadline:  # both connections are up
        time.sleep(0.01)
        ready = dict(poller.poll(100))
    assert set(ready) == {pipes.inboxes[0], pipes.inboxes[2]}
    pipes.drain(core, None, {pipes.inboxes[2]})
    assert seen == ["2/r0", "2/r1"]
    pipes.drain(core, None, ready)
    assert seen == ["2/r0", "2/r1", "0/r0", "0/r1"]
    senders[1].send(m.encode(m.Abort("r9")))
    poller.poll(1000)
    pipes.drain(core, None, None)
    assert seen[-1] == "1/r9"
    pipes.close()
    for s in [*senders, *outs]:
        s.close(linger=0)
    ctx.term()
