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
freed once the first event shows the copy done, or it comes as a kv_stream (http) or a NIXL read.

The HTTP exchanges and what their failures mean: sibling_client.py; bringing the KV here once a
sibling has answered: kv_fetch.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Container
from dataclasses import replace
from typing import TypeVar

import httpx
import msgspec

from trtllm_gateway.config.disagg import DisaggConfig
from trtllm_gateway.config.prefill_pools import parse_prefill_pools, pool_for
from trtllm_gateway.engine.capabilities import AbortSettling, EngineExtras, KvHandoff
from trtllm_gateway.engine.disagg import kv_check, kv_wire
from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.disagg.kv_fetch import KvFetch, NixlReadError
from trtllm_gateway.engine.disagg.kv_follow import KvFollower
from trtllm_gateway.engine.disagg.kv_room import KvRoom, Reservation, block_size_of
from trtllm_gateway.engine.disagg.kv_transport import KV_COPY_FAILED, KV_REFUSED, choose_transport
from trtllm_gateway.engine.disagg.prefill_policy import BusyPolicy
from trtllm_gateway.engine.disagg.sibling_client import (
    Answer,
    SiblingBusyError,
    SiblingClient,
    SiblingDownError,
    SiblingError,
    SiblingMismatchError,
)
from trtllm_gateway.engine.disagg.siblings import Sibling, SiblingPool, sibling_headers
from trtllm_gateway.engine.kv_region import HostArenas, KvPayload
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
        key = config.internal_api_key
        auth = sibling_headers(key.get_secret_value() if key is not None else None)
        self.sibs = SiblingClient(config.remote_prefill_timeout, auth, stats, transport)
        self.fetch = KvFetch(self.sibs)
        self._arenas = HostArenas()  # same-host siblings' arenas, read for their probe token
        self._transports: dict[str, str] = {}  # by sibling url: "v1" or a v2 transport
        self._leases: dict[str, tuple[Sibling, str, int, float]] = {}  # regions to free

    @property
    def extras(self) -> EngineExtras:
        """The inner engine's extras (all of them, whatever they are) plus the sibling stats."""
        routing = self.pool.kv_stats if self.followers else None
        return replace(
            self.inner.extras, remote_prefill=self.remote_prefill_stats, kv_routing=routing
        )

    async def start(self) -> None:
        self.sibs.start()
        await self.inner.start()
        self.info = self.inner.info
        self.fetch.open(self.info.kv_layout, self.info.max_model_len)
        self.room.block_size = block_size_of(self.info.kv_layout)
        for sib in self.pool.siblings:
            try:
                await self._check(sib)
            except SiblingError as e:
                logger.warning("prefill sibling %s not reachable at start-up: %s", sib.url, e)
                self._mark(sib, healthy=False)
        if self.config.kv_routing and len(self.pool.siblings) > 1:
            for sib in self.pool.siblings:
                follower = KvFollower(sib.url, sib.kv, self.sibs.http, self.sibs.auth)
                self.followers.append(follower)
                self.followers[-1].start()

    async def stop(self) -> None:
        for follower in self.followers:
            await follower.stop()
        await self.inner.stop()
        self.fetch.close()
        await self.sibs.aclose()

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
                            self.fetch.receive.free(req.request_id)
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
                        self.fetch.receive.disable(str(e))  # our own arena could not be read
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
            self.fetch.receive.free(request_id)

        if copied or not isinstance(self.inner, AbortSettling):
            free()
        else:
            self.inner.when_settled(request_id, free)

    def _done_with(self, lease: tuple[Sibling, str, int, float], copied: bool) -> None:
        """Free the sibling's staged region (a task: the stream goes on meanwhile)."""
        sib, ctx_id, nbytes, t0 = lease
        if copied:
            self.remote_prefill_stats.observe_transfer(nbytes, time.perf_counter() - t0)
        task = asyncio.ensure_future(self.sibs.release(sib, ctx_id))
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
        if not sib.healthy and not await self.sibs.healthy(sib):
            raise SiblingDownError("still unhealthy")
        await self._check(sib)
        transport = self._transports.get(sib.url, "v1")
        if transport != "v1":
            return await self._remote_v2(sib, req, transport)
        body = wire.PrefillBody.of(req.request_id, req.prompt_token_ids, req.sampling)
        content = wire.encode(body)
        res = await self.sibs.call("POST", sib, wire.PREFILL_PATH, content, req.trace_headers)
        answer, disagg = self._answer(res, wire.PrefillAnswer)
        if isinstance(self.inner, KvHandoff):
            ctx_id = answer.disaggregated_params.ctx_request_id
            async with self.sibs.leased(sib, ctx_id, answer.lease_s):
                kv = await self.fetch.pull(sib, ctx_id, req)
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
        res = await self.sibs.call(
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
                try:
                    async with self.sibs.leased(sib, ctx_id, answer.lease_s):
                        payload = await self.fetch.read_nixl(sib, ctx_id, region, req)
                except NixlReadError:
                    self._transports[sib.url] = "http"  # this sibling's next prompts stream
                    raise
                await self.sibs.release(sib, ctx_id)  # read: the sibling's region is free
            elif transport == "http":
                async with self.sibs.leased(sib, ctx_id, answer.lease_s):
                    payload = await self.fetch.stream(sib, ctx_id, req)
            elif region.transport != transport:
                raise SiblingError(f"asked for {transport}, the sibling staged {region.transport}")
            else:
                payload = KvPayload(region)
                self._leases[req.request_id] = (sib, ctx_id, region.nbytes, t0)
        except BaseException:
            await self.sibs.release(sib, ctx_id)
            raise
        self._mark(sib, healthy=True)
        return replace(disagg, kv_payload=payload)

    async def _check(self, sib: Sibling) -> None:
        """Refuse a sibling that serves another model or KV layout (once per sibling)."""
        if sib.checked:
            return
        res = await self.sibs.call("GET", sib, wire.INFO_PATH)
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


def _received(disagg: DisaggParams) -> bool:
    """The KV came over HTTP into this API server's receive arena."""
    kv = disagg.kv_payload
    return isinstance(kv, KvPayload) and kv.data is None and kv.region.transport == "shm"


def _queues(busy: dict[str, wire.QueueReport]) -> str:
    return ", ".join(f"{url}: {q.requests} requests, {q.tokens} tokens" for url, q in busy.items())
