"""The core's end of its clients' sockets: one gateway, or the API servers sharing one core.

    OnePipe    one client (the default): messages and batches pass as they are
    ManyPipes  --api-server-count N: an inbox and an outbox per API server. Inside the core a
               request id is qualified by its client's index ("1/chatcmpl-..."), so two servers
               may use the same id. A step's batch is encoded once and the same bytes go to
               every server, which keeps the events under its own prefix (Ready.id_prefix):
               splitting it and encoding a part a server cost the core's step thread ~14% of
               its time with eight servers (py-spy, H200, 135M at 256 running: issue 39), and
               a server's decode of the whole batch costs it ~50 us a step.

A context phase's held KV (a prefill sibling's /internal/v1/prefill) may be pulled or released
through any server: ExportKv and ReleaseKv find it by its client-side id, whoever held it.

A Stop from one of several clients detaches that client only (its requests are aborted, it gets
its last batch and Dead(stopped)); the core stops once the last one has detached.
"""

from __future__ import annotations

import collections
from collections.abc import Container, Sequence
from typing import Protocol

import msgspec
import zmq

from trtllm_gateway.engine.transport import messages as m
from trtllm_gateway.engine.transport import shm_blob

HELD_KEPT = 4096


class Handler(Protocol):
    """The part of the core (loop.Core) the pipes feed."""

    def handle(
        self, msg: m.Inbound, frames: list[bytes]
    ) -> tuple[m.Reply, bytes | None] | None: ...
    def batch(self) -> m.OutputBatch: ...


def _sockets(
    ctx: zmq.Context[zmq.Socket[bytes]], inbox: str, outbox: str
) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    pull.connect(inbox)
    push.connect(outbox)
    return pull, push


def _changed(batch: m.OutputBatch, last: m.OutputBatch | None) -> bool:
    return bool(batch.events or batch.errors) or _news_for_all(batch, last)


def _news_for_all(batch: m.OutputBatch, last: m.OutputBatch | None) -> bool:
    """What every client needs to hear: KV events, a new health or remote-encode count."""
    return last is None or bool(
        batch.kv_events or batch.health != last.health or batch.remote_encode != last.remote_encode
    )


class OnePipe:
    """The one client's inbox and outbox."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], inbox: str, outbox: str) -> None:
        self.inbox, self.outbox = _sockets(ctx, inbox, outbox)
        self.inboxes = [self.inbox]
        self._last: m.OutputBatch | None = None

    def send(self, msg: msgspec.Struct) -> None:
        self.outbox.send(m.encode(msg))

    def send_batch(self, batch: m.OutputBatch, always: bool = True) -> None:
        # A wake-up ends in a batch when it changed something: a step's tokens, a message's
        # effect (an abort), an idle tick that expired a KV hand-off (the health it carries).
        # An unchanged empty one is not sent: a stream of them kept the client's reader busy.
        if always or _changed(batch, self._last):
            self.outbox.send(m.encode(batch))
            self._last = batch

    def drain(
        self,
        core: Handler,
        shared: collections.deque[str] | None,
        ready: Container[object] | None = None,
    ) -> None:
        """Hand every queued message to the core; shared: the shared memory segments handed
        out lately (None: blobs go as frames); ready: the sockets the loop's poll found
        readable (None: try the inbox)."""
        if ready is not None and self.inbox not in ready:
            return
        while True:
            try:
                frames = self.inbox.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            reply = core.handle(m.decode_inbound(frames[0]), frames[1:])
            if reply is not None:
                _send_reply(self.outbox, reply, shared)

    def close(self) -> None:
        self.inbox.close(linger=0)
        self.outbox.close(linger=2000)  # the last batch and Dead reach the client


class ManyPipes:
    """An inbox and an outbox per client; request ids qualified by the client's index."""

    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], addresses: Sequence[tuple[str, str]]
    ) -> None:
        pairs = [_sockets(ctx, inbox, outbox) for inbox, outbox in addresses]
        self.inboxes = [pull for pull, _ in pairs]
        self._outboxes = [push for _, push in pairs]
        self._attached = set(range(len(pairs)))
        # qualified id -> (client, its own id), while the request runs.
        self._owner: dict[str, tuple[int, str]] = {}
        # A held context phase's client-side id -> its qualified id, until pulled or released
        # (the oldest forgotten past HELD_KEPT: those expired in the core long ago).
        self._held: dict[str, str] = {}
        self._last: m.OutputBatch | None = None

    def send(self, msg: msgspec.Struct) -> None:
        for client in sorted(self._attached):
            if isinstance(msg, m.Ready):  # each server learns the prefix of its own ids
                self._outboxes[client].send(
                    m.encode(msgspec.structs.replace(msg, id_prefix=f"{client}/"))
                )
            else:
                self._outboxes[client].send(m.encode(msg))

    def send_batch(self, batch: m.OutputBatch, always: bool = True) -> None:
        owner = self._owner
        for qualified in [q for q, ev in batch.events if ev.finish_reason is not None]:
            owner.pop(qualified, None)
        for qualified, _ in batch.errors:
            owner.pop(qualified, None)
        if not (always or _changed(batch, self._last)):
            return
        self._last = batch
        data = m.encode(batch)
        for client in self._attached:
            self._outboxes[client].send(data)

    def drain(
        self,
        core: Handler,
        shared: collections.deque[str] | None,
        ready: Container[object] | None = None,
    ) -> None:
        """ready: the inboxes the loop's poll found readable; only they are read (an inbox with
        nothing queued costs a receive that raises zmq.Again: ~5-10 us, eight a step with
        eight API servers)."""
        for client, inbox in enumerate(self.inboxes):
            if ready is not None and inbox not in ready:
                continue
            while client in self._attached:
                try:
                    frames = inbox.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                msg = m.decode_inbound(frames[0])
                if isinstance(msg, m.Stop):
                    self._detach(core, client)
                    continue
                reply = core.handle(self._qualified(client, msg), frames[1:])
                if reply is not None:
                    _send_reply(self._outboxes[client], reply, shared)

    def _qualified(self, client: int, msg: m.Inbound) -> m.Inbound:
        if isinstance(msg, m.Stop):
            return msg
        qualified = f"{client}/{msg.request_id}"
        if isinstance(msg, m.ExportKv):  # the staged region stays until the ReleaseKv
            qualified = self._held.get(msg.request_id, qualified)
        elif isinstance(msg, m.ReleaseKv):
            qualified = self._held.pop(msg.request_id, qualified)
        elif isinstance(msg, m.RenewKv):  # the pull or release that follows still finds it
            qualified = self._held.get(msg.request_id, qualified)
        elif isinstance(msg, m.Add):
            self._owner[qualified] = (client, msg.request_id)
            if msg.hold_kv:
                self._held[msg.request_id] = qualified
                if len(self._held) > HELD_KEPT:
                    del self._held[next(iter(self._held))]
        return msgspec.structs.replace(msg, request_id=qualified)

    def _detach(self, core: Handler, client: int) -> None:
        """The client stops: abort its requests, send it their last events and Dead(stopped);
        the last client's Stop stops the core."""
        if len(self._attached) == 1:
            core.handle(m.Stop(), [])  # the loop sends the last batch and Dead, and ends
            return
        for qualified, (who, _) in list(self._owner.items()):
            if who == client:
                core.handle(m.Abort(qualified), [])
        self.send_batch(core.batch())
        self._outboxes[client].send(m.encode(m.Dead("stopped", stopped=True)))
        self._attached.discard(client)

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.close(linger=0)
        for outbox in self._outboxes:
            outbox.close(linger=2000)


def _send_reply(
    outbox: zmq.Socket[bytes],
    reply: tuple[m.Reply, bytes | None],
    shared: collections.deque[str] | None,
) -> None:
    msg, blob = reply
    if blob is not None and shared is not None and (name := shm_blob.put(blob)):
        shared.append(name)
        msg, blob = msgspec.structs.replace(msg, shm=name, size=len(blob)), None
    outbox.send_multipart([m.encode(msg)] if blob is None else [m.encode(msg), blob])


Pipes = OnePipe | ManyPipes
