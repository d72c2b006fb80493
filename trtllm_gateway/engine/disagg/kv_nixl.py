"""The NIXL path: a prompt's staged KV read from the prefill instance's memory in one transfer.

    prefill API server  GET /internal/v2/nixl/{arena}: its agent registers the core's staging
                        arena (shared memory, mapped in this process) once and answers the
                        agent's metadata and the arena's address there
    decode API server   its agent registers its receive arena once and loads the sibling's
                        metadata once per arena; each prompt is then one READ of the staged
                        region into a region of the receive arena (a thread waits for it), which
                        the core copies as it copies the HTTP path's

NIXL (PyPI `nixl`, or `nixl-cu12` / `nixl-cu13`: the library Dynamo, vLLM's NixlConnector and
TensorRT-LLM move KV with, bundling UCX for RDMA, TCP or shared memory) is an optional extra:
without it /info says so and the decode side streams over HTTP. UCX delivers the bytes intact,
so there is no digest; the core checks shape, size and finiteness where it copies.

API (nixl/_api.py, nixl_agent): register_memory / get_reg_descs for DRAM, get_agent_metadata,
add_remote_agent (loadRemoteMD), initialize_xfer("READ", local, remote, agent), transfer,
check_xfer_state ("DONE" / "PROC" / "ERR"), release_xfer_handle (cancels an active transfer,
or raises when it cannot: then its target region is never reused).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from trtllm_gateway.engine.disagg.kv_receive import KvReceiveArena
from trtllm_gateway.engine.kv_region import KvRegion

logger = logging.getLogger(__name__)

POLL_S = 0.0002  # between checks of a transfer in flight (the GIL is free meanwhile)
PROGRESS_THREAD = True  # the target of a READ must progress it (without: never done, on the CPU)


class NixlError(Exception):
    """A NIXL transfer that did not complete. stopped: it is known not to write any more (its
    target region may be reused)."""

    def __init__(self, why: str, stopped: bool = True) -> None:
        super().__init__(why)
        self.stopped = stopped


class NixlArena(msgspec.Struct, frozen=True, kw_only=True):
    """GET /internal/v2/nixl/{arena}: the agent's metadata (base64 in JSON), the arena's
    address in the agent's process and its size."""

    metadata: bytes
    addr: int
    size: int


def _api() -> Any:
    """nixl._api (the meta package picks the CUDA variant), else a variant alone; None."""
    for name in ("nixl._api", "nixl_cu13._api", "nixl_cu12._api"):
        try:
            return __import__(name, fromlist=["nixl_agent"])
        except Exception:  # an ImportError, or a variant whose libraries fail to load
            continue
    return None


_API: Any = None
_API_TRIED = False
_API_LOCK = threading.Lock()


def nixl_api() -> Any:
    global _API, _API_TRIED
    with _API_LOCK:
        if not _API_TRIED:
            _API_TRIED = True
            _API = _api()
        return _API


def available() -> bool:
    return nixl_api() is not None


def address(view: memoryview) -> int:
    """The address of a buffer's first byte (the numpy view lives only for this call)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


@dataclass(slots=True)
class _Remote:
    agent: str
    addr: int
    size: int


class NixlEnd:
    """This process's NIXL agent (made at first use): registered arenas, known siblings."""

    def __init__(self, role: str) -> None:
        self.role = role
        self._agent: Any = None
        self._registered: dict[str, tuple[int, int]] = {}  # name -> (address, size)
        self._remotes: dict[tuple[str, str], _Remote] = {}  # (sibling, arena) -> its agent
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._agent is None:
            api = nixl_api()
            if api is None:
                raise NixlError("NIXL is not installed")
            name = f"tg-{self.role}-{os.getpid():x}-{secrets.token_hex(3)}"
            self._agent = api.nixl_agent(
                name, api.nixl_agent_config(enable_prog_thread=PROGRESS_THREAD, backends=["UCX"])
            )
        return self._agent

    def register(self, name: str, base: int, size: int) -> None:
        """size bytes at base (a shared-memory arena mapped here) registered once, as name."""
        with self._lock:
            if name not in self._registered:
                self._get().register_memory([(base, size, 0, name)], "DRAM")
                self._registered[name] = (base, size)

    def expose(self, name: str, buf: memoryview) -> NixlArena:
        """The prefill side: name's arena registered, and what a sibling needs to read it."""
        base, size = address(buf), len(buf)
        self.register(name, base, size)
        with self._lock:
            return NixlArena(metadata=self._get().get_agent_metadata(), addr=base, size=size)

    def known(self, sibling: str, arena: str) -> bool:
        return (sibling, arena) in self._remotes

    def connect(self, sibling: str, arena: str, info: NixlArena) -> None:
        """The decode side: a sibling's agent loaded (again when its metadata changed)."""
        with self._lock:
            agent = self._get()
            for key, old in list(self._remotes.items()):
                if key[0] == sibling:  # its agent reloaded, with this arena registered too
                    del self._remotes[key]
                    try:
                        agent.remove_remote_agent(old.agent)
                    except Exception as e:  # gone already: the load below says what stands
                        logger.debug("NIXL remote agent %s: %s", old.agent, e)
            try:
                name = agent.add_remote_agent(info.metadata)
            except Exception as e:  # nixl's binding raises plain exceptions
                raise NixlError(f"the sibling's NIXL metadata cannot be loaded: {e}") from None
            self._remotes[(sibling, arena)] = _Remote(
                name.decode() if isinstance(name, bytes) else str(name), info.addr, info.size
            )

    def read(
        self,
        sibling: str,
        arena: str,
        offset: int,
        nbytes: int,
        into: int,
        deadline: float,
        abort: threading.Event,
    ) -> None:
        """nbytes at offset of a sibling's arena -> this process's address `into` (registered),
        in one READ; returns once done. Blocks: run it on a thread. Raises NixlError."""
        remote = self._remotes.get((sibling, arena))
        if remote is None:
            raise NixlError(f"no NIXL agent known for arena {arena}")
        if offset < 0 or nbytes <= 0 or offset + nbytes > remote.size:
            raise NixlError(f"range [{offset}, {offset + nbytes}) outside arena {arena}")
        with self._lock:
            agent = self._get()
            local = agent.get_xfer_descs([(into, nbytes, 0)], "DRAM")
            src = agent.get_xfer_descs([(remote.addr + offset, nbytes, 0)], "DRAM")
            try:
                handle = agent.initialize_xfer("READ", local, src, remote.agent)
            except Exception as e:  # nixl's binding raises plain exceptions
                raise NixlError(f"NIXL READ refused: {e}") from None
            state = agent.transfer(handle)
        while state == "PROC" and not abort.is_set() and time.monotonic() < deadline:
            time.sleep(POLL_S)
            with self._lock:
                state = agent.check_xfer_state(handle)
        try:
            with self._lock:
                agent.release_xfer_handle(handle)  # cancels one still in flight
        except Exception as e:
            if state == "PROC":
                raise NixlError(f"a NIXL READ could not be cancelled: {e}", stopped=False) from None
            logger.debug("NIXL handle release: %s", e)
        if state == "PROC":
            raise NixlError("aborted" if abort.is_set() else "the NIXL READ timed out")
        if state != "DONE":
            raise NixlError("the NIXL READ failed")

    def close(self) -> None:
        with self._lock:
            self._agent = None  # the agent's destructor deregisters and disconnects
            self._registered.clear()
            self._remotes.clear()


async def pull(
    end: NixlEnd,
    sibling: str,
    region: KvRegion,
    receive: KvReceiveArena,
    request_id: str,
    fetch: Callable[[str], Awaitable[bytes]],
    deadline_s: float,
) -> KvRegion | None:
    """The decode side: a sibling's staged region READ into the receive arena; the region
    there (shm, for the core), or None when the arena has no room (stream it instead). fetch
    GETs a path of the sibling (its NIXL agent, once per arena). Raises NixlError."""
    spot = receive.place(request_id, region)
    if spot is None:
        return None
    into, mine = address(spot[0]), spot[1]
    whole = receive.whole()
    assert whole is not None  # a region was placed in it
    base, size = address(whole), len(whole)
    del spot, whole  # no view of the arena outlives this call (it could not be closed)
    done = False
    try:
        if not end.known(sibling, region.arena):
            try:
                info = msgspec.json.decode(await fetch(region.arena), type=NixlArena)
            except msgspec.ValidationError as e:
                raise NixlError(f"bad NIXL agent answer: {e}") from None
            await asyncio.to_thread(end.connect, sibling, region.arena, info)
        await asyncio.to_thread(end.register, f"receive:{mine.arena}", base, size)
        abort = threading.Event()
        until = time.monotonic() + deadline_s
        read = (sibling, region.arena, region.offset, region.nbytes, into, until, abort)
        task = asyncio.ensure_future(asyncio.to_thread(end.read, *read))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            abort.set()  # its thread cancels the READ; the region is freed once it has
            task.add_done_callback(lambda t: _settled(t, receive, request_id))
            done = True
            raise
        except NixlError as e:
            done = not e.stopped  # a READ that may still write keeps its region, for good
            if not e.stopped:
                logger.error("request %s: %s; its receive region is not reused", request_id, e)
            raise
        done = True
        return mine
    finally:
        if not done:
            receive.free(request_id)


def _settled(task: asyncio.Future[None], receive: KvReceiveArena, request_id: str) -> None:
    e = task.exception() if not task.cancelled() else None
    if isinstance(e, NixlError) and not e.stopped:
        logger.error("request %s: %s; its receive region is not reused", request_id, e)
        return
    receive.free(request_id)
