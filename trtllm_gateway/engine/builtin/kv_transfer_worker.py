"""KvTransferWorker: a core's KV hand-off copies, on a thread of their own (on CUDA, a stream).

    step thread                                 kv-transfer thread
    stage(id, blocks)  ── records an event ──▶  wait for it, gather the blocks into a region of
      (a context phase ended)                   the arena, sync ──▶ Staged(id, region)
    load(id, reserved blocks, source) ───────▶  check and scatter the source (a peer GPU's region
      (a decode-side Add)                       read in place, shm, or a frame), sync ──▶ Loaded
    done() ◀── each step, after the Wakeup ────

The step thread only allocates a byte range, records an event and queues the job: it gathers
nothing and copies nothing (tests/engine/test_kv_transfer_worker.py measures it per hand-off).
The core frees the prefill side's blocks once Staged, and admits a decode-side sequence once
Loaded: the blocks it reserved before the copy are written by then.

On GPUs of one host a hand-off is paged instead (kv_across.py): pool_region() describes the
prompt's blocks in this core's shared pool at once, with no job (the core holds the blocks
until the sibling releases them), and the decode side's load reads them across in one kernel.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtllm_gateway.engine.builtin.backend import KvCaches
from trtllm_gateway.engine.builtin.device_dtype import with_index
from trtllm_gateway.engine.builtin.kv_across import AcrossReader, DevicePool
from trtllm_gateway.engine.builtin.kv_staging import (
    DeviceArena,
    HostArena,
    Sources,
    as_kv,
    dtype_of,
    gather,
    scatter_checked,
)
from trtllm_gateway.engine.disagg.kv_transport import KV_COPY_FAILED, KV_REFUSED
from trtllm_gateway.engine.kv_region import KvRegion, KvRegionError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Staged:
    """A context phase's KV is in `region` (None and `error` set when the copy failed)."""

    request_id: str
    region: KvRegion | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Loaded:
    """A decode-side sequence's reserved blocks hold the sibling's KV (or `error` says why not)."""

    request_id: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class _Stage:
    request_id: str
    arena: HostArena | DeviceArena
    region: KvRegion
    block_table: list[int]
    event: torch.cuda.Event | None


@dataclass(frozen=True, slots=True)
class _Load:
    request_id: str
    region: KvRegion
    payload: bytes | bytearray | memoryview | None  # the bytes of a "frame" region (HTTP)
    block_table: list[int]


class KvTransferWorker:
    def __init__(
        self,
        caches: KvCaches,
        block_size: int,
        device: torch.device,
        kv_layout: str,
        arena_bytes: int,
        lease_s: float,
        wake: Callable[[], None],
    ) -> None:
        self.caches = caches
        self.block_size = block_size
        self.device = with_index(device)  # the thread's set_device refuses a bare "cuda"
        self.kv_layout = kv_layout
        self.arena_bytes = arena_bytes
        self.lease_s = lease_s
        self.cache_dtype = caches[0][0].dtype
        self._host: HostArena | None = None
        self._gpu: DeviceArena | None = None
        self._wake = wake
        self._jobs: queue.SimpleQueue[_Stage | _Load | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Staged | Loaded] = queue.SimpleQueue()
        self._cuda = device.type == "cuda"
        self.sources = Sources(pin=self._cuda)
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None  # type: ignore[no-untyped-call]
        self._pool: DevicePool | None = None  # shared at the first paged hand-off
        self._pool_tried = False
        self._across: AcrossReader | None = None  # made at the first paged load
        # Step-thread seconds of the latest stage() / pool_region() / load() calls (bounded:
        # a serving core makes millions; bench.kv_copy takes their median).
        self.handoff_s: deque[float] = deque(maxlen=4096)
        self._thread = threading.Thread(target=self._run, name="kv-transfer", daemon=True)
        self._thread.start()

    # --- the step thread --------------------------------------------------------------------
    def stage(self, request_id: str, block_table: list[int], num_tokens: int, device: bool) -> str:
        """Queue the gather of a held prompt's KV; '' or why it cannot be staged now (full)."""
        t0 = time.perf_counter()
        try:
            arena = self._arena(device)
        except (OSError, RuntimeError) as e:
            return f"no KV staging arena: {e}"
        shape = (len(self.caches), 2, num_tokens, *self.caches[0][0].shape[1:])
        region = arena.describe(0, (shape, str(self.cache_dtype), self.kv_layout))
        offset = arena.alloc.alloc(region.nbytes, request_id, t0 + self.lease_s)
        if offset is None:
            return "the KV staging arena is full"
        region = arena.describe(offset, (shape, str(self.cache_dtype), self.kv_layout))
        event = None
        if self._cuda:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()  # the compute stream's writes of these blocks come first
        self._jobs.put(_Stage(request_id, arena, region, list(block_table), event))
        self.handoff_s.append(time.perf_counter() - t0)
        return ""

    def share_pool(self) -> None:
        """Export the pool's IPC handles now, not at the first hand-off: a prefill instance's
        first pool_region took 1.8 ms of the step thread for them (two H200, 2026-11-28)."""
        if not self._pool_tried:
            self._pool_tried = True
            self._pool = DevicePool.of(self.caches, self.kv_layout) if self._cuda else None

    def pool_region(self, block_table: list[int], num_tokens: int) -> KvRegion | None:
        """A paged region of the prompt's blocks in this core's shared pool (the caller holds
        the blocks until the sibling is done), or None when the pool cannot be shared."""
        t0 = time.perf_counter()
        self.share_pool()
        if self._pool is None:
            return None
        region = self._pool.describe(block_table, num_tokens, self.block_size)
        self.handoff_s.append(time.perf_counter() - t0)
        return region

    def load(
        self,
        request_id: str,
        region: KvRegion,
        payload: bytes | bytearray | memoryview | None,
        block_table: list[int],
    ) -> None:
        """Queue the copy of a sibling's KV into blocks this core reserved for it."""
        t0 = time.perf_counter()
        self._jobs.put(_Load(request_id, region, payload, list(block_table)))
        self.handoff_s.append(time.perf_counter() - t0)

    def done(self) -> list[Staged | Loaded]:
        """What the worker finished (the step thread is the one reader: empty() is exact here,
        and asking it costs no raised Empty on the many calls that find nothing)."""
        out: list[Staged | Loaded] = []
        while not self._done.empty():
            out.append(self._done.get_nowait())
        return out

    def free(self, request_id: str) -> bool:
        """Free a staged region (the sibling took it, or gave up); False when none is held."""
        return any(a.alloc.free(request_id) for a in self._arenas())

    def renew(self, request_id: str, now: float) -> bool:
        """The sibling still wants this region: its lease runs a full lease from now."""
        return any(a.alloc.renew(request_id, now + self.lease_s) for a in self._arenas())

    def expire(self, now: float) -> list[str]:
        """Free regions whose lease ran out (a sibling that never took them); their ids."""
        return [rid for a in self._arenas() for rid in a.alloc.expire(now)]

    def held(self) -> bool:
        return any(a.alloc.owners() for a in self._arenas())

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(10.0)
        for arena in self._arenas():
            arena.close()
        self._host = self._gpu = None
        self.sources.close()

    def host_arena(self) -> HostArena | None:
        """The shared-memory arena, made now (a prefill instance announces it), or None when
        /dev/shm has no room for it."""
        try:
            arena = self._arena(device=False)
        except (OSError, RuntimeError) as e:
            logger.warning("no KV staging arena in shared memory: %s", e)
            return None
        assert isinstance(arena, HostArena)
        return arena

    def _arenas(self) -> list[HostArena | DeviceArena]:
        return [a for a in (self._host, self._gpu) if a is not None]

    def _arena(self, device: bool) -> HostArena | DeviceArena:
        """The host arena (shm; the HTTP path's staging), or the GPU's (cuda_ipc)."""
        if device and self._cuda:
            if self._gpu is None:
                self._gpu = DeviceArena(self.arena_bytes, self.device)
            return self._gpu
        if self._host is None:
            self._host = HostArena(self.arena_bytes, pin=self._cuda)
        return self._host

    # --- the transfer thread ----------------------------------------------------------------
    def _run(self) -> None:
        if self._cuda:
            torch.cuda.set_device(self.device)  # Triton launches on the thread's device
        ctx = torch.cuda.stream(self._stream) if self._stream is not None else None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                if ctx is not None:
                    with ctx:
                        result = self._do(job)
                else:
                    result = self._do(job)
            except Exception as e:  # a copy that failed fails its request, not the core
                logger.exception("KV transfer of %s failed", job.request_id)
                why = f"{KV_COPY_FAILED}: {type(e).__name__}: {e}"
                result = (
                    Staged(job.request_id, None, f"KV staging failed: {why}")
                    if isinstance(job, _Stage)
                    else Loaded(job.request_id, f"{KV_REFUSED}: {why}")
                )
            self._done.put(result)
            self._wake()

    def _do(self, job: _Stage | _Load) -> Staged | Loaded:
        if isinstance(job, _Stage):
            if job.event is not None and self._stream is not None:
                self._stream.wait_event(job.event)
            r = job.region
            dst = as_kv(job.arena.region(r.offset, r.nbytes), r.shape, self.cache_dtype)
            gather(self.caches, job.block_table, self.block_size, dst)
            self._sync()
            return Staged(job.request_id, r)
        r = job.region
        if r.blocks:  # a sibling pool's blocks, read across in place
            if self._across is None:
                self._across = AcrossReader(self.caches, self.block_size, self.sources)
            if not self._across.read(r, job.block_table):
                return Loaded(job.request_id, f"{KV_REFUSED}: NaN or infinite values")
            self._sync()
            return Loaded(job.request_id)
        if job.payload is not None:  # torch wants a writable buffer: bytes are copied once
            data = job.payload if isinstance(job.payload, bytearray) else bytearray(job.payload)
            raw = torch.frombuffer(data, dtype=torch.uint8)
        else:
            raw = self.sources.tensor(r)
        if raw.numel() != r.nbytes:
            raise KvRegionError(f"KV source holds {raw.numel()} bytes, {r.nbytes} due")
        kv = as_kv(raw, r.shape, dtype_of(r.dtype))
        if not scatter_checked(self.caches, job.block_table, self.block_size, kv):
            return Loaded(job.request_id, f"{KV_REFUSED}: NaN or infinite values")
        self._sync()
        return Loaded(job.request_id)

    def _sync(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
