"""RemotePrefillEngine: a decode instance's engine that runs context phases on prefill siblings.

generate() decides local or remote (conditional disaggregation), asks a sibling for the context
phase over HTTP (same token ids and request id; the internal key as credential), pulls the KV
blobs when the inner engine is the built-in one, and continues decoding on the inner engine. A
failing sibling falls back to local prefill unless --require-remote-prefill; cancelling the
request cancels the sibling's work too. Sibling protocol: engine/disagg/sibling_wire.py.

Backpressure, not health (issue 41): KV room here is reserved before a prompt is sent
(kv_room.py); a busy sibling (503 with its queue) is retried or the prompt prefilled locally by
BusyPolicy (prefill_policy.py) and never marked unhealthy; only connection and protocol
failures mark a sibling (SiblingDownError), and a slow one that still answers /health is not;
the hand-off lease is renewed while the KV pull waits.

With protocol v2 (kv_transport.py picks the transport per sibling at its /info) the answer names
where the KV is staged: the inner core copies it from there (shm, cuda_ipc) and the region is
freed once the first event shows the copy done, or it comes as a kv_stream (http).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Container
from dataclasses import dataclass, field, replace
from typing import TypeVar

import httpx
import msgspec

from trtllm_gateway.config.disagg import DisaggConfig
from trtllm_gateway.config.prefill_pools import parse_prefill_pools, pool_for
from trtllm_gateway.engine.capabilities import AbortSettling, EngineExtras, KvHandoff
from trtllm_gateway.engine.disagg import kv_check, kv_nixl, kv_stream, kv_wire
from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.disagg.kv_follow import KvFollower
from trtllm_gateway.engine.disagg.kv_receive import KvReceiveArena
from trtllm_gateway.engine.disagg.kv_room import KvRoom, Reservation, block_size_of
from trtllm_gateway.engine.disagg.kv_transport import KV_COPY_FAILED, KV_REFUSED, choose_transport
from trtllm_gateway.engine.disagg.prefill_policy import BusyPolicy
from trtllm_gateway.engine.disagg.siblings import Sibling, SiblingPool, sibling_headers
from trtllm_gateway.engine.kv_region import HostArenas, KvPayload, KvRegion
from trtllm_gateway.engine.protocol import (
    DisaggParams,
    Engine,
    EngineHealth,
    EngineInfo,
    GenerateRequest,
    InvalidRequestError,
    PrefillResult,
    RemotePrefillFailedError,
    TokenEvent,
)
from trtllm_gateway.engine.stats import RemotePrefillStats

logger = logging.getLogger(__name__)
A = TypeVar("A", bound=wire.PrefillAnswer)


class SiblingError(Exception):
    """A sibling did not serve this prompt (slow, its KV expired): fall back if allowed."""


class SiblingDownError(SiblingError):
    """A connection or protocol failure (refused, reset, non-2xx, bad payload): the sibling is
    marked unhealthy and skipped for --sibling-backoff."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SiblingBusyError(SiblingError):
    """A sibling answered 503 (full or draining) with its queue: BusyPolicy decides."""

    def __init__(self, message: str, queue: wire.QueueReport, retry_after: float | None) -> None:
        super().__init__(message)
        self.queue = queue
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Answer:
    """A sibling's answer, its body read whole (within the cap and the deadline)."""

    status_code: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def retry_after(self) -> float | None:
        """A 503's Retry-After in seconds (None: absent or an HTTP date)."""
        value = self.headers.get("retry-after", "")
        try:
            return max(0.0, float(value)) if value else None
        except ValueError:
            return None

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


class SiblingMismatchError(Exception):
    """A sibling serves another model or KV layout: a configuration error, never a fallback."""


class RemotePrefillEngine:
    """Wraps the local engine; every protocol member but generate is the inner engine's (extras
    adds this wrapper's sibling stats to the inner engine's)."""

    def __init__(
        self,
        inner: Engine,
        config: DisaggConfig,
        stats: RemotePrefillStats,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: httpx.MockTransport
    ) -> None:
        self.inner = inner
        self.config = config
        self.remote_prefill_stats = stats
        self.info: EngineInfo = inner.info
        self.pool = SiblingPool(
            config.prefill_url, config.sibling_backoff, config.kv_routing_load_weight
        )
        self.pools = parse_prefill_pools(config.prefill_pools) if config.prefill_pools else ()
        self.followers: list[KvFollower] = []  # KV-aware routing (docs/kv_events.md)
        self.policy = BusyPolicy(config.busy_local_factor, config.remote_prefill_retries)
        self.room = KvRoom(inner.health, block_size_of(inner.info.kv_layout))
        self._tasks: set[asyncio.Future[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._transport = transport
        key = config.internal_api_key
        self._auth = sibling_headers(key.get_secret_value() if key is not None else None)
        self._arenas = HostArenas()  # same-host siblings' arenas, read for their probe token
        self._transports: dict[str, str] = {}  # by sibling url: "v1" or a v2 transport
        self._leases: dict[str, tuple[Sibling, str, int, float]] = {}  # regions to free
        self._receive = KvReceiveArena("", 0)  # the HTTP and NIXL paths' (made at start)
        self._nixl = kv_nixl.NixlEnd("decode")  # its agent made at the first NIXL read

    @property
    def extras(self) -> EngineExtras:
        """The inner engine's extras (all of them, whatever they are) plus the sibling stats."""
        routing = self.pool.kv_stats if self.followers else None
        return replace(
            self.inner.extras, remote_prefill=self.remote_prefill_stats, kv_routing=routing
        )

    async def start(self) -> None:
        self._client = httpx.AsyncClient(
            timeout=self.config.remote_prefill_timeout, transport=self._transport
        )
        await self.inner.start()
        self.info = self.inner.info
        self._receive = KvReceiveArena(self.info.kv_layout, self.info.max_model_len)
        self.room.block_size = block_size_of(self.info.kv_layout)
        for sib in self.pool.siblings:
            try:
                await self._check(sib)
            except SiblingError as e:
                logger.warning("prefill sibling %s not reachable at start-up: %s", sib.url, e)
                self._mark(sib, healthy=False)
        if self.config.kv_routing and len(self.pool.siblings) > 1:
            for sib in self.pool.siblings:
                self.followers.append(KvFollower(sib.url, sib.kv, self._client, self._auth))
                self.followers[-1].start()

    async def stop(self) -> None:
        for follower in self.followers:
            await follower.stop()
        await self.inner.stop()
        self._nixl.close()
        self._receive.close()
        if self._client is not None:
            await self._client.aclose()

    def health(self) -> EngineHealth:
        return self.inner.health()

    async def prefill(self, req: GenerateRequest) -> PrefillResult:
        return await self.inner.prefill(req)

    def abort(self, request_id: str) -> None:
        self.inner.abort(request_id)

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        room: Reservation | None = None
        try:
            disagg, room = await self._context_phase(req)
            inner_req = req if disagg is None else replace(req, disagg=disagg)
            lease = self._leases.pop(req.request_id, None)
            stream = self.inner.generate(inner_req)
            first = True
            try:
                try:
                    async for ev in stream:
                        if room is not None:  # admitted: its blocks are the engine's own now
                            room.release()
                        if lease is not None:  # the first event: the core copied the region
                            self._done_with(lease, copied=True)
                            lease = None
                        if first:
                            self._receive.free(req.request_id)
                        first = False
                        yield ev
                except InvalidRequestError as e:
                    if disagg is None or not first or not str(e).startswith(KV_REFUSED):
                        raise
                    # The sibling's KV failed the core's checks or could not be copied: this
                    # prompt prefills here, and that sibling sends its next ones over HTTP.
                    if lease is not None:
                        self._transports[lease[0].url] = "http"
                    elif _received(disagg) and KV_COPY_FAILED in str(e):
                        self._receive.disable(str(e))  # our own arena could not be read
                    self._fallback(req, str(e))
                    local = self.inner.generate(req)
                    try:
                        async for ev in local:
                            yield ev
                    finally:
                        await local.aclose()  # type: ignore[attr-defined]
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
                self._after_copy(req.request_id, lease, copied=not first)
        finally:
            if room is not None:
                room.release()

    def _after_copy(
        self, request_id: str, lease: tuple[Sibling, str, int, float] | None, copied: bool
    ) -> None:
        """Free the regions the core copied the KV from (the sibling's staged one, our receive
        arena's): at once when the first event said the copy was done, else once the core has
        settled the aborted request (capabilities.AbortSettling), never under a copy."""

        def free() -> None:
            if lease is not None:
                self._done_with(lease, copied=False)
            self._receive.free(request_id)

        if copied or not isinstance(self.inner, AbortSettling):
            free()
        else:
            self.inner.when_settled(request_id, free)

    def _done_with(self, lease: tuple[Sibling, str, int, float], copied: bool) -> None:
        """Free the sibling's staged region (a task: the stream goes on meanwhile)."""
        sib, ctx_id, nbytes, t0 = lease
        if copied:
            self.remote_prefill_stats.observe_transfer(nbytes, time.perf_counter() - t0)
        task = asyncio.ensure_future(self._release(sib, ctx_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- the context phase ---------------------------------------------------------------
    async def _context_phase(
        self, req: GenerateRequest
    ) -> tuple[DisaggParams | None, Reservation | None]:
        """DisaggParams from a sibling and the KV room held for them here, or (None, None) to
        prefill locally."""
        uncached = len(req.prompt_token_ids)
        if isinstance(self.inner, KvHandoff):
            uncached -= self.inner.cached_prefix_tokens(req.prompt_token_ids)
        if uncached < self.config.max_local_prefill_tokens or req.images:
            self.remote_prefill_stats.record("local_short")
            return None, None
        if self.info.engine == "trtllm" and (
            req.sampling.logprobs is not None or req.sampling.prompt_logprobs is not None
        ):
            # TensorRT-LLM 1.2 has no logprob for the token a context sibling hands over and
            # fails such a stream (executor/result.py asserts): prefill here, logprobs right.
            self.remote_prefill_stats.record("local_logprobs")
            return None, None
        # Room for the prompt's KV and its first tokens (one block more) before any sibling
        # computes KV for it.
        first = min(req.sampling.max_tokens, self.room.block_size or 1)
        room = await self.room.reserve(
            len(req.prompt_token_ids) + first, self.config.remote_prefill_timeout
        )
        if room is None:
            self._fallback(req, "no KV room for the prompt here in time", "local_no_room")
            return None, None
        try:
            disagg = await self._remote_or_local(req, uncached)
        except BaseException:
            room.release()
            raise
        if disagg is None:
            room.release()
            return None, None
        return disagg, room

    async def _remote_or_local(self, req: GenerateRequest, uncached: int) -> DisaggParams | None:
        """Ask siblings until one serves the context phase, every one is busy past BusyPolicy,
        or one fails (None: prefill locally)."""
        busy: dict[str, wire.QueueReport] = {}  # this round's busy answers, by sibling URL
        retries, retry_after, was_busy = 0, None, False
        while True:
            sib = self._choose(req.prompt_token_ids, exclude=busy)
            if sib is None and busy:
                retries += 1
                wait = self.policy.wait_before_retry(uncached, busy.values(), retries, retry_after)
                if wait is None:
                    why = f"every prefill sibling is busy ({_queues(busy)})"
                    self._fallback(req, why, "local_busy")
                    return None
                await asyncio.sleep(wait)
                busy.clear()
                continue
            if sib is None:
                self._fallback(req, "no healthy prefill sibling")
                return None
            try:
                with self.pool.busy(sib, uncached):
                    disagg = await self._remote(sib, req)
            except SiblingMismatchError as e:
                self.remote_prefill_stats.record("failed")
                raise RemotePrefillFailedError(str(e)) from None
            except SiblingBusyError as e:
                self.remote_prefill_stats.busy_answers[sib.url] += 1
                busy[sib.url], retry_after, was_busy = e.queue, e.retry_after, True
                continue
            except SiblingDownError as e:
                self._mark(sib, healthy=False)
                self._fallback(req, f"prefill sibling {sib.url} failed: {e}")
                return None
            except SiblingError as e:
                self._fallback(req, f"prefill sibling {sib.url} did not serve it: {e}")
                return None
            self.remote_prefill_stats.record("remote_retried" if was_busy else "remote")
            return disagg

    def _choose(
        self, prompt_token_ids: tuple[int, ...], exclude: Container[str] = ()
    ) -> Sibling | None:
        """The prompt length's pool (--prefill-pools), then the KV-aware or least-busy pick,
        among those not in `exclude` (the siblings that answered busy this round)."""
        among: list[Sibling] | None = None
        pool = pool_for(self.pools, len(prompt_token_ids))
        if pool is not None:
            among = [s for s in self.pool.siblings if s.url in pool.urls]
        if exclude:
            among = [
                s for s in (self.pool.siblings if among is None else among) if s.url not in exclude
            ]
        if self.followers:
            return self.pool.pick_for(prompt_token_ids, among)[0]
        return self.pool.pick(among)

    def _fallback(self, req: GenerateRequest, why: str, outcome: str = "local_fallback") -> None:
        if self.config.require_remote_prefill:
            self.remote_prefill_stats.record("failed")
            raise RemotePrefillFailedError(f"{why} (--require-remote-prefill is set)")
        log = logger.info if outcome == "local_busy" else logger.warning
        log("request %s: %s; prefilling locally", req.request_id, why)
        self.remote_prefill_stats.record(outcome)

    def _mark(self, sib: Sibling, healthy: bool) -> None:
        self.pool.mark(sib, healthy)
        self.remote_prefill_stats.siblings_healthy[sib.url] = healthy

    async def _remote(self, sib: Sibling, req: GenerateRequest) -> DisaggParams:
        if not sib.healthy and not await self._healthy(sib):
            raise SiblingDownError("still unhealthy")
        await self._check(sib)
        transport = self._transports.get(sib.url, "v1")
        if transport != "v1":
            return await self._remote_v2(sib, req, transport)
        body = wire.PrefillBody.of(req.request_id, req.prompt_token_ids, req.sampling)
        content = wire.encode(body)
        res = await self._call("POST", sib, wire.PREFILL_PATH, content, req.trace_headers)
        answer, disagg = self._answer(res, wire.PrefillAnswer)
        if isinstance(self.inner, KvHandoff):
            ctx_id = answer.disaggregated_params.ctx_request_id
            async with self._leased(sib, ctx_id, answer.lease_s):
                kv = await self._pull(sib, ctx_id, req)
            disagg = replace(disagg, kv_payload=kv)
        self._mark(sib, healthy=True)
        return disagg

    def _answer(self, res: Answer, kind: type[A]) -> tuple[A, DisaggParams]:
        """A prefill answer that names valid first tokens (else the sibling is broken)."""
        try:
            answer = wire.decode(res.content, kind)
            disagg = answer.generation_only(kv_payload=None)
        except wire.SiblingWireError as e:
            raise SiblingDownError(f"bad prefill response: {e}") from None
        vocab = self.info.vocab_size
        first = answer.first_token_ids
        if not first or (vocab and not all(0 <= t < vocab for t in first)):
            raise SiblingDownError(f"bad prefill response: first token ids {list(first)[:8]}")
        return answer, disagg

    async def _remote_v2(self, sib: Sibling, req: GenerateRequest, transport: str) -> DisaggParams:
        """Protocol v2: the answer says where the KV is staged; copy it from there (the core
        does, for shm and cuda_ipc) or stream it (http)."""
        body = wire.PrefillBodyV2.of(req.request_id, req.prompt_token_ids, req.sampling)
        body = msgspec.structs.replace(body, protocol_version=2, kv_transport=transport)
        res = await self._call(
            "POST", sib, wire.PREFILL_V2_PATH, wire.encode(body), req.trace_headers
        )
        t0 = time.perf_counter()
        answer, disagg = self._answer(res, wire.PrefillAnswerV2)
        ctx_id, region = answer.disaggregated_params.ctx_request_id, answer.kv
        try:
            if region is None:
                raise SiblingDownError("bad prefill response: no KV region")
            try:
                kv_check.check_region(region, self.info.kv_layout, len(req.prompt_token_ids))
            except kv_wire.KvWireError as e:
                raise SiblingDownError(f"bad KV: {e}") from None
            if transport == "nixl":
                async with self._leased(sib, ctx_id, answer.lease_s):
                    payload = await self._read_nixl(sib, ctx_id, region, req)
                await self._release(sib, ctx_id)  # read: the sibling's region is free
            elif transport == "http":
                async with self._leased(sib, ctx_id, answer.lease_s):
                    payload = await self._stream(sib, ctx_id, req)
            elif region.transport != transport:
                raise SiblingError(f"asked for {transport}, the sibling staged {region.transport}")
            else:
                payload = KvPayload(region)
                self._leases[req.request_id] = (sib, ctx_id, region.nbytes, t0)
        except BaseException:
            await self._release(sib, ctx_id)
            raise
        self._mark(sib, healthy=True)
        return replace(disagg, kv_payload=payload)

    async def _stream(self, sib: Sibling, ctx_id: str, req: GenerateRequest) -> KvPayload:
        """The HTTP path: the staged region as kv_stream frames, read on a thread into this
        API server's receive arena (or one buffer), checked as it comes (the header against
        the prompt before any payload; the digest hashed on another thread)."""
        t0 = time.perf_counter()
        layout, tokens = self.info.kv_layout, len(req.prompt_token_ids)
        url = f"{sib.url}{wire.kv_v2_path(ctx_id)}"
        headers = {**dict(req.trace_headers), **self._auth}
        deadline = self.config.remote_prefill_timeout
        pull = kv_stream.KvPull(url, headers, kv_check.max_blob_bytes(layout, tokens), deadline)
        placed: list[KvRegion] = []
        frame: list[bytearray] = []

        def place(region: KvRegion) -> memoryview:
            spot = self._receive.place(req.request_id, region)
            if spot is not None:
                placed.append(spot[1])
                return spot[0]
            frame.append(bytearray(region.nbytes))
            return memoryview(frame[0])

        def check(region: KvRegion) -> None:
            kv_check.check_region(region, layout, tokens)

        try:
            try:
                async with asyncio.timeout(deadline + 1.0):
                    region = await asyncio.to_thread(pull.run, check, place)
            except BaseException:
                pull.abort()  # a cancelled or late pull: its thread stops reading now
                self._receive.free(req.request_id)
                raise
        except TimeoutError:
            raise SiblingError(f"GET {url} took more than {deadline:g} s") from None
        except kv_stream.KvPullError as e:
            raise SiblingError(str(e)) from None
        except kv_wire.KvWireError as e:
            raise SiblingDownError(f"bad KV: {e}") from None
        self.remote_prefill_stats.observe_transfer(region.nbytes, time.perf_counter() - t0)
        if placed:
            return KvPayload(placed[0])
        return KvPayload(region, frame[0])

    async def _read_nixl(
        self, sib: Sibling, ctx_id: str, region: KvRegion, req: GenerateRequest
    ) -> KvPayload:
        """The NIXL path (kv_nixl.py): one READ of the staged region into the receive arena;
        a region that does not fit there is streamed as over HTTP."""
        t0 = time.perf_counter()

        async def fetch(arena: str) -> bytes:
            return (await self._call("GET", sib, wire.nixl_path(arena), None, ())).content

        try:
            mine = await kv_nixl.pull(
                self._nixl, sib.url, region, self._receive, req.request_id, fetch,
                self.config.remote_prefill_timeout,
            )  # fmt: skip
        except kv_nixl.NixlError as e:
            self._transports[sib.url] = "http"  # this sibling's next prompts stream
            raise SiblingError(f"NIXL: {e}") from None
        if mine is None:
            return await self._stream(sib, ctx_id, req)
        self.remote_prefill_stats.observe_transfer(region.nbytes, time.perf_counter() - t0)
        return KvPayload(mine)

    async def _pull(self, sib: Sibling, ctx_id: str, req: GenerateRequest) -> bytes:
        """The held KV, at most the prompt's size in our layout, checked off the event loop."""
        t0 = time.perf_counter()
        layout, tokens = self.info.kv_layout, len(req.prompt_token_ids)
        cap = kv_check.max_blob_bytes(layout, tokens)
        try:
            res = await self._call(
                "GET", sib, wire.kv_path(ctx_id), None, req.trace_headers, max_bytes=cap
            )
        except asyncio.CancelledError:
            await self._release(sib, ctx_id)
            raise
        except SiblingDownError as e:
            if e.status == 404:  # its hand-off expired: a lost prompt, not a dead sibling
                raise SiblingError(f"KV no longer held: {e}") from None
            raise
        blob = res.content
        try:
            await asyncio.to_thread(kv_check.check_blob, blob, layout, tokens)
        except kv_wire.KvWireError as e:
            raise SiblingDownError(f"bad KV: {e}") from None
        self.remote_prefill_stats.observe_transfer(len(blob), time.perf_counter() - t0)
        return blob

    @contextlib.asynccontextmanager
    async def _leased(self, sib: Sibling, ctx_id: str, lease_s: float) -> AsyncIterator[None]:
        """Renew the sibling's hold on ctx_id's KV every third of its lease while the body
        runs (a sibling that named no lease is not renewed)."""
        if lease_s <= 0:
            yield
            return
        renewing = asyncio.create_task(self._renew(sib, ctx_id, lease_s / 3))
        try:
            yield
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

    async def _renew(self, sib: Sibling, ctx_id: str, every: float) -> None:
        assert self._client is not None
        url = f"{sib.url}{wire.lease_path(ctx_id)}"
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(httpx.HTTPError):  # the pull itself reports a failure
                res = await self._client.post(url, headers=self._auth, timeout=every)
                if res.status_code == 200:
                    self.remote_prefill_stats.lease_renewals += 1

    async def _release(self, sib: Sibling, ctx_id: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            assert self._client is not None
            await asyncio.shield(
                self._client.delete(f"{sib.url}{wire.kv_path(ctx_id)}", headers=self._auth)
            )

    async def _check(self, sib: Sibling) -> None:
        """Refuse a sibling that serves another model or KV layout (once per sibling)."""
        if sib.checked:
            return
        res = await self._call("GET", sib, wire.INFO_PATH)
        try:
            info = wire.decode(res.content, wire.SiblingInfo)
        except wire.SiblingWireError as e:
            raise SiblingMismatchError(f"prefill sibling {sib.url} is no gateway: {e}") from None
        ours = self.inner.info
        theirs = (info.model, info.kv_layout, info.protocol_version)
        if theirs != (ours.model_id, ours.kv_layout, wire.PROTOCOL_VERSION):
            raise SiblingMismatchError(
                f"prefill sibling {sib.url} is incompatible: it serves model {theirs[0]!r} with "
                f"KV layout {theirs[1]!r} (protocol {theirs[2]}), this instance serves "
                f"{ours.model_id!r} with {ours.kv_layout!r} (protocol {wire.PROTOCOL_VERSION})"
            )
        if isinstance(self.inner, KvHandoff):
            transport = choose_transport(self.config.kv_transport, info, ours, self._arenas)
            if self._transports.get(sib.url) != transport:
                logger.info("prefill sibling %s: KV moves by %s", sib.url, transport)
            self._transports[sib.url] = transport
        sib.checked = True

    async def _healthy(self, sib: Sibling) -> bool:
        try:
            assert self._client is not None
            async with asyncio.timeout(2.0):
                res = await self._client.get(f"{sib.url}/health", timeout=2.0)
            return res.status_code == 200
        except (httpx.HTTPError, TimeoutError):
            return False

    async def _call(
        self,
        method: str,
        sib: Sibling,
        path: str,
        content: bytes | None = None,
        trace: tuple[tuple[str, str], ...] = (),
        max_bytes: int | None = None,
    ) -> Answer:
        """One exchange within --remote-prefill-timeout, its body read to at most max_bytes.

        trace: the request's W3C trace context, so the sibling's span is a child of ours."""
        assert self._client is not None
        url = f"{sib.url}{path}"
        headers = {**dict(trace), **self._auth}
        if content is not None:
            headers["Content-Type"] = "application/json"
        deadline = self.config.remote_prefill_timeout
        try:
            async with asyncio.timeout(deadline):
                res = await self._exchange(method, url, headers, content, max_bytes)
        except (TimeoutError, httpx.TimeoutException):
            # Slow is not dead: a sibling whose /health still answers is not marked.
            slow = f"{method} {path} took more than {deadline:g} s"
            raise (SiblingError if await self._healthy(sib) else SiblingDownError)(slow) from None
        except httpx.HTTPError as e:
            raise SiblingDownError(f"{type(e).__name__}: {e}") from None
        if res.status_code == 503:
            queue = wire.QueueReport.of_headers(res.headers)
            raise SiblingBusyError(
                f"{method} {path} answered 503: {res.text[:200]}", queue, res.retry_after
            )
        if res.status_code != 200:
            raise SiblingDownError(
                f"{method} {path} answered {res.status_code}: {res.text[:200]}", res.status_code
            )
        return res

    async def _exchange(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        content: bytes | None,
        max_bytes: int | None,
    ) -> Answer:
        """The response, its body read whole; past max_bytes (declared or sent) a SiblingError
        before more is buffered (a 1.5 GB body grew a decode instance by 3 GB, kept)."""
        assert self._client is not None
        request = self._client.build_request(method, url, headers=headers, content=content)
        res = await self._client.send(request, stream=True)
        try:
            declared = res.headers.get("content-length", "")
            if max_bytes is not None and declared.isdigit() and int(declared) > max_bytes:
                raise SiblingDownError(f"{url} declares {declared} bytes, more than {max_bytes}")
            body = bytearray()
            async for chunk in res.aiter_bytes():
                body += chunk
                if max_bytes is not None and len(body) > max_bytes:
                    raise SiblingDownError(f"{url} sent more than {max_bytes} bytes")
        finally:
            await res.aclose()
        return Answer(res.status_code, bytes(body), {k.lower(): v for k, v in res.headers.items()})


def _received(disagg: DisaggParams) -> bool:
    """The KV came over HTTP into this API server's receive arena."""
    kv = disagg.kv_payload
    return isinstance(kv, KvPayload) and kv.data is None and kv.region.transport == "shm"


def _queues(busy: dict[str, wire.QueueReport]) -> str:
    return ", ".join(f"{url}: {q.requests} requests, {q.tokens} tokens" for url, q in busy.items())
