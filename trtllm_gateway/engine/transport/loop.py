"""The core loop: messages in, one OutputBatch out per step, over ZMQ; in a process or a thread.

    poll(inbox, parent) ─▶ handle every queued message ─▶ step ─▶ send OutputBatch ─▶ poll ...

It blocks on the inbox only while the core has no work it can progress on (a queue waiting for
KV blocks that only an abort, a release or a hand-off's expiry can free counts as none); with
work, it takes what has queued and steps again. A second thread answers PrefixProbes (a read of
the prefix cache) so conditional disaggregation never waits for a step. The loop ends on Stop
(Dead(stopped=True)), on an engine bug (Dead with the reason) or when the parent process is gone
(no orphan engine).
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import zmq

from trtllm_gateway.engine.transport import messages as m
from trtllm_gateway.engine.transport import run_dir, shm_blob
from trtllm_gateway.engine.transport.pipes import ManyPipes, OnePipe, Pipes

logger = logging.getLogger(__name__)

PROBE_POLL_MS = 200
SHARED_KEPT = 256  # recent shared memory segments a core cleans up if it dies with them out
PARENT_GONE = 1  # the exit status when the gateway died without a Stop


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where the client binds: the inbox (client -> core), outbox (core -> client), probe."""

    inbox: str
    outbox: str
    probe: str


class Core(Protocol):
    """What the loop drives (engine/builtin/core.py EngineCore)."""

    stopping: bool

    def load(self, progress: Callable[[str], None]) -> m.Ready: ...
    @property
    def wake_fd(self) -> int | None:
        """Readable when work finished off the loop (an image encode) waits to be admitted."""
        ...

    def handle(
        self, msg: m.Inbound, frames: list[bytes]
    ) -> tuple[m.Reply, bytes | None] | None: ...
    def has_work(self) -> bool: ...
    def idle_timeout(self) -> float | None: ...
    def step(self) -> None: ...
    def batch(self) -> m.OutputBatch: ...
    def cached_prefix_tokens(self, prompt_token_ids: tuple[int, ...]) -> int: ...
    @property
    def steps_on_cpu(self) -> bool:
        """A step holds the GIL throughout (a CUDA step drops it while it waits on the GPU)."""
        ...


def run_core(
    make_core: Callable[[], Core],
    ctx: zmq.Context[zmq.Socket[bytes]],
    addrs: Addresses | tuple[Addresses, ...],
    parent_sentinel: int | None = None,
    shares_gil: bool = False,
) -> int:
    """Load the core, then serve until Stop; the exit status (0 after Stop, 1 on failure).

    addrs: one client's, or each API server's (--api-server-count, pipes.ManyPipes).
    shares_gil: the loop runs in a thread of the gateway (inproc.py), beside its event loop.
    """
    clients = (addrs,) if isinstance(addrs, Addresses) else addrs
    pipes: Pipes = (
        OnePipe(ctx, addrs.inbox, addrs.outbox)
        if isinstance(addrs, Addresses)
        else ManyPipes(ctx, [(a.inbox, a.outbox) for a in clients])
    )
    stop_probe = threading.Event()
    probe: threading.Thread | None = None
    # KV blobs go through shared memory only to another process (inproc:// frames are not copied).
    shared: collections.deque[str] | None = None
    if clients[0].outbox.startswith("ipc://"):
        shared = collections.deque(maxlen=SHARED_KEPT)
    status = 1
    try:
        try:
            core = make_core()
            pipes.send(core.load(lambda d: pipes.send(m.Loading(d))))
            pipes.send_batch(core.batch())  # what loading produced (the first KV event)
            if not shares_gil:  # a process of its own: in a gateway's, its garbage would stay
                settle_heap()
        except Exception as e:
            logger.exception("engine core failed to load")
            pipes.send(m.Dead(f"model failed to load: {e}"))
            return 1
        probes = [a.probe for a in clients]
        probe = threading.Thread(
            target=_answer_probes, args=(core, ctx, probes, stop_probe), daemon=True
        )
        probe.start()
        try:
            yield_gil = shares_gil and core.steps_on_cpu
            status = _serve(core, pipes, parent_sentinel, shared, yield_gil)
            if status == PARENT_GONE and parent_sentinel is not None:
                if isinstance(pipes, ManyPipes):  # API servers outlive their supervisor a moment
                    pipes.send(m.Dead("the gateway's supervisor process is gone"))
                for client in clients:
                    _remove_socket_dir(client)
            return status
        except Exception as e:  # a loop bug: still tell the client, which fails its streams
            logger.exception("engine core loop failed")
            pipes.send(m.Dead(f"engine core failed: {e}"))
            return 1
    finally:
        if status != 0 and shared:
            # The client reads every reply before Dead after a Stop; on any other exit it may
            # be gone, and a segment nobody takes would outlive both processes.
            for name in shared:
                shm_blob.discard(name)
        stop_probe.set()
        if probe is not None:
            probe.join(2 * PROBE_POLL_MS / 1000)
        pipes.close()


def settle_heap() -> None:
    """What loading made (the model, torch, tokenizer tables) lives as long as the core: out of
    the collector's sight, a full collection no longer walks it while steps make and drop their
    few thousand small objects a step (vLLM freezes its heap after start-up too). Only in a
    process that ends with its core: frozen objects are never collected, so a process that
    loads core after core (the gateway with its core in a thread, a test run) would keep every
    earlier core's cycles (a tests/engine run grew past 23 GiB)."""
    gc.collect()
    gc.freeze()


def _serve(
    core: Core,
    pipes: Pipes,
    parent: int | None,
    shared: collections.deque[str] | None,
    yield_gil: bool,
) -> int:
    poller = zmq.Poller()
    for inbox in pipes.inboxes:
        poller.register(inbox, zmq.POLLIN)
    if parent is not None:
        poller.register(parent, zmq.POLLIN)
    if core.wake_fd is not None:
        poller.register(core.wake_fd, zmq.POLLIN)
    while True:
        if core.has_work():
            timeout_ms: int | None = 0
        else:
            idle = core.idle_timeout()
            timeout_ms = None if idle is None else int(idle * 1000)
        ready = dict(poller.poll(timeout_ms))
        if parent is not None and parent in ready:
            logger.warning("the gateway process is gone; the engine core exits")
            return PARENT_GONE
        pipes.drain(core, shared, ready)
        if core.stopping:
            pipes.send_batch(core.batch())
            pipes.send(m.Dead("stopped", stopped=True))
            return 0
        try:
            core.step()
        except Exception as e:  # an engine bug: every request fails, the core is dead
            logger.exception("engine step failed")
            pipes.send_batch(core.batch())
            pipes.send(m.Dead(f"engine step failed: {e}"))
            return 1
        pipes.send_batch(core.batch(), always=False)
        if yield_gil:
            # In a thread beside the event loop, hand it the GIL between CPU steps. A CPU step
            # is hundreds of eager ops that each drop and retake the GIL; letting the loop
            # render its chunks here, in one go, keeps it from retaking the GIL mid-step
            # (served tok/s at concurrency 8: 40-49 with the yield, 35 without). A CUDA step
            # drops the GIL only while it waits on the GPU, which is when the loop should run:
            # there the yield cost 7-34% of offline and ~20% of served throughput (H100, 135M).
            time.sleep(0)


def _remove_socket_dir(addrs: Addresses) -> None:
    """A gateway killed with SIGKILL never removes its ipc:// directory (/tmp/gateway-core-*):
    its orphaned core, the last one using it, does."""
    paths = [a.removeprefix("ipc://") for a in (addrs.inbox, addrs.outbox, addrs.probe)]
    if not all(a.startswith("ipc://") for a in (addrs.inbox, addrs.outbox, addrs.probe)):
        return
    folders = {os.path.dirname(p) for p in paths}
    if len(folders) == 1:
        folder = folders.pop()
        if os.path.basename(folder).startswith(run_dir.PREFIX):
            shutil.rmtree(folder, ignore_errors=True)


def _answer_probes(
    core: Core, ctx: zmq.Context[zmq.Socket[bytes]], addresses: list[str], stop: threading.Event
) -> None:
    # One REP connected to every client's REQ: it answers each on the pipe its probe came in.
    sock = ctx.socket(zmq.REP)
    for address in addresses:
        sock.connect(address)
    try:
        while not stop.is_set():
            if not sock.poll(PROBE_POLL_MS):
                continue
            msg = m.decode_probe(sock.recv())
            cached = 0
            if isinstance(msg, m.PrefixProbe):
                try:
                    cached = core.cached_prefix_tokens(msg.prompt_token_ids)
                except Exception:  # a racing step changed the cache under us: say none
                    logger.debug("prefix probe failed", exc_info=True)
            sock.send(m.encode(m.ProbeReply(cached)))
    finally:
        sock.close(linger=0)
