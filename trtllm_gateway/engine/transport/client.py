"""CoreClient: the Engine (and KvHandoff) the gateway sees when the step loop runs elsewhere.

    generate ─▶ Add ──▶ [core: admit, step, step, ...] ──▶ OutputBatch (one a step)
                                                            │ output task: per-request queues
    per-request queue ◀─────────────────────────────────────┘

One output task reads the batches and fans them out; a consumer that fell behind gets its queued
tokens as one event. Closing a stream before its last event sends Abort. The core's death (a Dead
message, or its process's sentinel going readable) fails every open stream with EngineDeadError
at once and turns health to dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio

from trtllm_gateway.engine.capabilities import EngineExtras
from trtllm_gateway.engine.disagg import kv_wire
from trtllm_gateway.engine.kv_events.log import KvEventLog
from trtllm_gateway.engine.kv_region import HostArenas, KvPayload, KvRegion, KvRegionError
from trtllm_gateway.engine.protocol import (
    EngineDeadError,
    EngineError,
    EngineHealth,
    EngineInfo,
    EngineState,
    GenerateRequest,
    InvalidRequestError,
    OverloadedError,
    PrefillResult,
    TokenEvent,
)
from trtllm_gateway.engine.transport import messages as m
from trtllm_gateway.engine.transport import run_dir, shm_blob
from trtllm_gateway.engine.transport.image_body import images_body
from trtllm_gateway.engine.transport.launch import Launcher
from trtllm_gateway.engine.transport.loop import Addresses
from trtllm_gateway.engine.transport.stream import follow, prefill_result

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
EXIT_GRACE_S = 10.0  # after its outputs end, for a ready core to exit by itself
UNREADY_EXIT_GRACE_S = 1.0
PROBE_TIMEOUT_MS = 1000

_Item = TokenEvent | EngineError


class CoreClient:
    def __init__(
        self,
        launcher: Launcher,
        model_id: str,
        block_size: int,
        addresses: Addresses | None = None,
    ) -> None:
        """addresses: where to bind, chosen by whoever runs the core for several clients
        (--api-server-count; attach.AttachedCore); None: a directory of this client's own."""
        self.launcher = launcher
        self.addresses = addresses
        self.kv_event_log = KvEventLog(block_size)  # KvEventSource: the core's, forwarded
        self.info = EngineInfo(model_id=model_id, max_model_len=0, vocab_size=0, eos_token_ids=())
        self.tokenizer_dir: str | None = None
        # Remote-encode outcomes for /metrics (--encode-url on a vision model), the core's.
        self.remote_encode_outcomes: Counter[str] | None = None
        self._state: EngineState = "loading"
        self._detail = ""
        self._health = EngineHealth(state="loading")
        self._queues: dict[str, asyncio.Queue[_Item]] = {}
        # Before each of this client's request ids in a batch: "" when the core is its own,
        # "<i>/" when API servers share it and every batch carries every server's events.
        self._id_prefix = ""
        # Requests closed before their last event (a client gone): the core's last word on each
        # (its final event or error) is still to come, and who waits for it (when_settled).
        self._abandoned: dict[str, list[Callable[[], None]]] = {}
        self._replies: dict[int, asyncio.Future[KvRegion]] = {}
        self.arenas = HostArenas()  # the core's staging arena, read in place (pull_kv)
        self._cookies = itertools.count()
        self._stopping = False
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._actx = zmq.asyncio.Context.shadow(self._ctx)
        self._dir: str | None = None
        self._inbox: zmq.Socket[bytes] | None = None
        self._outbox: zmq.asyncio.Socket | None = None
        self._probe: zmq.Socket[bytes] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handshake: asyncio.Future[bytes] | None = None
        self._exited = False
        self._watching: int | None = None  # the core's exit fd while a reader is on it

    @property
    def extras(self) -> EngineExtras:
        path = Path(self.tokenizer_dir) if self.tokenizer_dir else None
        return EngineExtras(path, remote_encode=self.remote_encode_outcomes)

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        addrs = self._bind()
        self.launcher.start(self._ctx, addrs)
        self._watching = self.launcher.sentinel
        if self._watching is not None:
            self._loop.add_reader(self._watching, self._on_exit)
        assert self._outbox is not None
        self._handshake = asyncio.ensure_future(self._outbox.recv())
        try:
            first: m.Outbound = m.decode_outbound(await self._handshake)
            while isinstance(first, m.Loading):  # progress for /health while the core loads
                logger.info("engine core: %s", first.detail)
                self._detail = first.detail
                self._handshake = asyncio.ensure_future(self._outbox.recv())
                first = m.decode_outbound(await self._handshake)
        except asyncio.CancelledError:
            if not self._exited:
                raise
            first = m.Dead(self._exit_detail())
        if not isinstance(first, m.Ready):
            detail = first.detail if isinstance(first, m.Dead) else "no handshake"
            self._die(detail)  # stop() joins the core and closes the sockets
            raise EngineDeadError(detail)
        self.info = first.info
        self._detail = ""
        self.tokenizer_dir = first.tokenizer_dir or None
        self._health = first.health
        self._id_prefix = first.id_prefix
        self.kv_event_log.num_blocks = first.kv_blocks
        if first.remote_encode:
            self.remote_encode_outcomes = Counter()
        self._state = "ready"
        self._reader = asyncio.create_task(self._read(), name="engine-core-output")

    async def stop(self) -> None:
        if self._state != "dead":
            self._state = "draining"
            self._stopping = True
            self._send(m.Stop())
            if self._reader is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._reader), STOP_TIMEOUT_S)
        self._unwatch()
        # A core that never said Ready has nothing to drain, and while it loads the model or
        # waits for a kernel build it does not read Stop: the full grace only delayed the kill
        # (a --startup-timeout exit or a Ctrl-C during a first start took 10 s more).
        grace = EXIT_GRACE_S if self._reader is not None else UNREADY_EXIT_GRACE_S
        if not await asyncio.to_thread(self.launcher.join, grace):
            logger.warning("engine core did not exit %.0f s after Stop; killing it", grace)
            self.launcher.kill()
        self._close()

    def health(self) -> EngineHealth:
        if self._state != "ready":
            return replace(self._health, state=self._state, detail=self._detail)
        return self._health

    # --- requests ---------------------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        add, frames = self._add(req, hold_kv=False)
        async for ev in self._stream(add, frames):
            yield ev

    async def prefill(self, req: GenerateRequest) -> PrefillResult:
        """Context phase only: the first token, and the prompt's KV held for a sibling."""
        req = replace(req, sampling=replace(req.sampling, max_tokens=1))
        add, frames = self._add(req, hold_kv=True)
        events = [ev async for ev in self._stream(add, frames)]
        return prefill_result(req.request_id, events, self.info.kv_layout)

    def abort(self, request_id: str) -> None:
        if self._state in ("ready", "draining"):
            self._send(m.Abort(request_id))

    def when_settled(self, request_id: str, fn: Callable[[], None]) -> None:
        """AbortSettling: fn once the core has said its last on request_id, at once if nothing
        of it is outstanding. A request aborted mid-copy of its KV ends with a final event after
        the copy (engine/builtin/kv_handoffs.py), so the region it read may be reused then."""
        waiters = self._abandoned.get(request_id)
        if waiters is None:
            fn()
        else:
            waiters.append(fn)

    def _abandon(self, request_id: str) -> None:
        """A stream closed before its last event: abort it, and watch for the core's last word."""
        if self._state in ("ready", "draining"):
            self._abandoned.setdefault(request_id, [])
        self.abort(request_id)

    def _settled(self, request_id: str) -> None:
        for fn in self._abandoned.pop(request_id, ()):
            fn()

    async def stage_kv(self, ctx_request_id: str) -> KvRegion:
        """Where the core staged a held context phase's KV; it stays until release_kv."""
        self._check_serving()
        assert self._loop is not None
        cookie = next(self._cookies)
        fut: asyncio.Future[KvRegion] = self._loop.create_future()
        self._replies[cookie] = fut
        self._send(m.ExportKv(cookie, ctx_request_id))
        return await fut

    def kv_view(self, region: KvRegion) -> memoryview:
        return self.arenas.view(region)

    def kv_arena(self, name: str) -> memoryview:
        if name != self.info.kv_arena:  # only the core's own staging arena, never a sibling's
            raise KvRegionError(f"{name!r} is not this engine's KV arena")
        buf = self.arenas.segment(name).buf
        assert buf is not None
        return buf

    async def pull_kv(self, ctx_request_id: str) -> bytes:
        """The staged KV as a kv_wire blob (protocol v1's GET), its region then freed."""
        region = await self.stage_kv(ctx_request_id)
        try:
            return await asyncio.to_thread(self._blob, region)
        finally:
            self.release_kv(ctx_request_id)

    def release_kv(self, ctx_request_id: str) -> None:
        if self._state in ("ready", "draining"):
            self._send(m.ReleaseKv(ctx_request_id))

    def renew_kv(self, ctx_request_id: str) -> None:
        if self._state in ("ready", "draining"):
            self._send(m.RenewKv(ctx_request_id))

    def cached_prefix_tokens(self, prompt_token_ids: tuple[int, ...]) -> int:
        """One round trip to the core's probe thread (never waits for a step); 0 if none."""
        sock = self._probe
        if sock is None or self._state != "ready":
            return 0
        sock.send(m.encode(m.PrefixProbe(prompt_token_ids)))
        if not sock.poll(PROBE_TIMEOUT_MS):
            return 0
        reply = m.decode_probe(sock.recv())
        return reply.cached_tokens if isinstance(reply, m.ProbeReply) else 0

    # --- internals --------------------------------------------------------------------------
    def _check_serving(self) -> None:
        if self._state == "loading":
            raise OverloadedError("the model is still loading")
        if self._state != "ready":
            raise EngineDeadError(self._detail or "the engine is not serving")

    def _add(self, req: GenerateRequest, hold_kv: bool) -> tuple[m.Add, list[bytes | bytearray]]:
        """The Add message and the frames after it: the sibling's KV, then the pixels."""
        self._check_serving()
        if (
            req.request_id in self._queues
        ):  # its queue would be taken over; the core checks the rest
            raise InvalidRequestError(f"request id {req.request_id!r} is already in flight")
        add = m.Add(
            req.request_id,
            req.prompt_token_ids,
            req.sampling,
            hold_kv=hold_kv,
            trace_headers=req.trace_headers,
        )
        frames: list[bytes | bytearray] = []
        d = req.disagg
        if d is not None and d.request_type == "generation_only":
            kv = d.kv_payload
            if not isinstance(kv, (bytes, KvPayload)) or not d.first_token_ids:
                raise InvalidRequestError("generation_only needs the sibling's KV and first token")
            first = {"first_token_ids": d.first_token_ids, "first_logprobs": d.first_logprobs}
            add = msgspec.structs.replace(add, **first)
            if isinstance(kv, KvPayload):  # a region to copy from, or its bytes in a frame
                add = msgspec.structs.replace(add, kv_source=kv.region)
                if kv.data is not None:
                    frames.append(kv.data)
            else:  # an old sibling's kv_wire blob
                frames.append(kv)
        elif d is not None and d.request_type == "context_only" and d.kv_device:
            add = msgspec.structs.replace(add, kv_device=True)
        if req.images:  # a model without images refuses them in the core (the first event)
            hashes = tuple(img.hash for img in req.images)
            add = msgspec.structs.replace(add, image_hashes=hashes)
            frames.append(images_body(req.images))
        return add, frames

    async def _stream(
        self, add: m.Add, frames: list[bytes | bytearray]
    ) -> AsyncIterator[TokenEvent]:
        data = _encode_add(add)  # before anything is registered: a bad value is a 400
        q: asyncio.Queue[_Item] = asyncio.Queue()
        self._queues[add.request_id] = q
        if self._inbox is not None:
            self._inbox.send_multipart([data, *frames], copy=not frames)
        # Closed with this generator, so an abort is sent at once, not when it is collected.
        events = follow(self._queues, add.request_id, self._abandon)
        async with contextlib.aclosing(events):
            async for item in events:
                yield item

    def _send(self, msg: m.Inbound, *frames: bytes) -> None:
        sock = self._inbox
        if sock is not None:
            sock.send_multipart([m.encode(msg), *frames], copy=not frames)

    async def _read(self) -> None:
        assert self._outbox is not None
        while True:
            frames = await self._outbox.recv_multipart()
            msg = m.decode_outbound(frames[0])
            if isinstance(msg, m.OutputBatch):
                self._health = msg.health
                if msg.kv_events:
                    self.kv_event_log.extend(msg.kv_events)
                if msg.remote_encode is not None and self.remote_encode_outcomes is not None:
                    self.remote_encode_outcomes.update(
                        {
                            k: v - self.remote_encode_outcomes[k]
                            for k, v in msg.remote_encode.items()
                        }
                    )
                queues, prefix = self._queues, self._id_prefix
                cut = len(prefix)
                for request_id, ev in msg.events:
                    if cut:
                        if not request_id.startswith(prefix):
                            continue  # another API server's
                        request_id = request_id[cut:]
                    q = queues.get(request_id)
                    if q is not None:
                        q.put_nowait(ev)
                    elif ev.finish_reason is not None and request_id in self._abandoned:
                        self._settled(request_id)
                for request_id, err in msg.errors:
                    if cut:
                        if not request_id.startswith(prefix):
                            continue
                        request_id = request_id[cut:]
                    q = queues.get(request_id)
                    if q is not None:
                        q.put_nowait(err.exception())
                    elif request_id in self._abandoned:
                        self._settled(request_id)
            elif isinstance(msg, m.Reply):
                fut = self._replies.pop(msg.cookie, None)
                if fut is not None and not fut.done():
                    if msg.error is not None:
                        fut.set_exception(msg.error.exception())
                    elif msg.kv is None:
                        fut.set_exception(EngineError("the KV hand-off was lost"))
                    else:
                        fut.set_result(msg.kv)
                elif msg.shm is not None:  # nobody waits for it any more: still unlink it
                    with contextlib.suppress(OSError):
                        self._take(msg)
            elif isinstance(msg, m.Dead):
                self._die("" if msg.stopped else msg.detail)
                return
            # recv on a socket with a message queued completes without suspending: a core that
            # sends fast enough would keep this task running and starve every other (/health).
            await asyncio.sleep(0)

    def _blob(self, region: KvRegion) -> bytes:
        """A staged region as a kv_wire blob: one copy and a checksum, on a thread."""
        header = {
            "kv_layout": region.kv_layout,
            "dtype": region.dtype,
            "shape": tuple(region.shape),
            "block_size": int(region.kv_layout.rsplit(":bs", 1)[-1]),
            "num_tokens": region.shape[2],
        }
        return kv_wire.encode(header, self.arenas.view(region))

    @staticmethod
    def _take(msg: m.Reply) -> bytes:
        assert msg.shm is not None
        return shm_blob.take(msg.shm, msg.size)

    def _on_exit(self) -> None:
        """The core process exited: at once, not at the next read (it may never come)."""
        self._exited = True
        self._unwatch()
        if self._handshake is not None and not self._handshake.done():
            self._handshake.cancel()  # start() reports it
            return
        if self._stopping:
            return  # Stop's Dead(stopped) is in the pipe; the reader ends on it
        if self._state != "dead":
            self._die(self._exit_detail())
        if self._reader is not None:
            self._reader.cancel()

    def _exit_detail(self) -> str:
        code = self.launcher.exitcode  # None: not this process's child (attach.AttachedCore)
        return "engine core process exited" + ("" if code is None else f" (code {code})")

    def _die(self, detail: str) -> None:
        self._state = "dead" if detail else "draining"
        self._detail = detail
        if detail:
            logger.error("engine core dead: %s", detail)
        err = EngineDeadError(detail or "the engine stopped")
        for q in self._queues.values():
            q.put_nowait(err)
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(err)
        self._replies.clear()
        for request_id in list(self._abandoned):  # no copy of the core's goes on
            self._settled(request_id)

    def _bind(self) -> Addresses:
        addrs = self.addresses or self._own_addresses()
        self._inbox = self._ctx.socket(zmq.PUSH)
        self._inbox.setsockopt(zmq.SNDHWM, 0)
        self._inbox.bind(addrs.inbox)
        self._outbox = self._actx.socket(zmq.PULL)
        self._outbox.setsockopt(zmq.RCVHWM, 0)
        self._outbox.bind(addrs.outbox)
        self._probe = self._ctx.socket(zmq.REQ)
        self._probe.setsockopt(zmq.REQ_RELAXED, 1)
        self._probe.setsockopt(zmq.REQ_CORRELATE, 1)
        self._probe.bind(addrs.probe)
        return addrs

    def _own_addresses(self) -> Addresses:
        if self.launcher.transport == "ipc":
            self._dir = run_dir.make()
            base = f"ipc://{self._dir}/"
        else:
            base = f"inproc://core-{id(self)}-"
        return Addresses(base + "in", base + "out", base + "probe")

    def _unwatch(self) -> None:
        if self._watching is not None and self._loop is not None:
            self._loop.remove_reader(self._watching)
            self._watching = None

    def _close(self) -> None:
        self._unwatch()
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        for sock in (self._inbox, self._outbox, self._probe):
            if sock is not None:
                sock.close(linger=0)
        self._inbox = self._outbox = self._probe = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _encode_add(add: m.Add) -> bytes:
    """The Add on the wire; a value msgpack cannot carry (an int past 64 bits) is refused."""
    try:
        return m.encode(add)
    except (OverflowError, msgspec.EncodeError) as e:
        seed = add.sampling.seed
        if seed is not None and not -(2**63) <= seed < 2**64:
            raise InvalidRequestError("seed is out of range", param="seed") from None
        raise InvalidRequestError(f"a request value is out of range: {e}") from None
