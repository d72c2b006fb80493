"""KvFetch: a prompt's KV brought from the prefill sibling that holds it into this API server,
once the sibling's answer has said where it is (engine/disagg/remote_prefill.py asks).

  pull       protocol v1: GET the held blob whole, at most the prompt's size in our layout,
             checked off the event loop
  stream     protocol v2, http: the staged region as kv_stream frames, read on a thread into
             the receive arena (or one buffer), the header checked against the prompt before
             any payload, the digest hashed on another thread
  read_nixl  protocol v2, nixl: one READ of the staged region into the receive arena
             (kv_nixl.py); a region that does not fit there is streamed instead

The receive arena (kv_receive.py) is this API server's; the engine core copies from it, and the
caller frees a prompt's place once the core has (KvFetch.receive.free).
"""

from __future__ import annotations

import asyncio
import time

from trtllm_gateway.engine.disagg import kv_check, kv_nixl, kv_stream, kv_wire
from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.disagg.kv_receive import KvReceiveArena
from trtllm_gateway.engine.disagg.sibling_client import (
    SiblingClient,
    SiblingDownError,
    SiblingError,
)
from trtllm_gateway.engine.disagg.siblings import Sibling
from trtllm_gateway.engine.kv_region import KvPayload, KvRegion
from trtllm_gateway.engine.protocol import GenerateRequest


class NixlReadError(SiblingError):
    """A NIXL READ failed: this prompt falls back, the sibling's next ones stream over HTTP."""


class KvFetch:
    def __init__(self, sibs: SiblingClient) -> None:
        self.sibs = sibs
        self.layout = ""
        self.receive = KvReceiveArena("", 0)  # the HTTP and NIXL paths' (made at open)
        self._nixl = kv_nixl.NixlEnd("decode")  # its agent made at the first NIXL read

    def open(self, layout: str, max_model_len: int) -> None:
        """Once the inner engine has started: its KV layout, and a receive arena for it."""
        self.layout = layout
        self.receive = KvReceiveArena(layout, max_model_len)

    def close(self) -> None:
        self._nixl.close()
        self.receive.close()

    async def pull(self, sib: Sibling, ctx_id: str, req: GenerateRequest) -> bytes:
        """The held KV, at most the prompt's size in our layout, checked off the event loop."""
        t0 = time.perf_counter()
        tokens = len(req.prompt_token_ids)
        cap = kv_check.max_blob_bytes(self.layout, tokens)
        try:
            res = await self.sibs.call(
                "GET", sib, wire.kv_path(ctx_id), None, req.trace_headers, max_bytes=cap
            )
        except asyncio.CancelledError:
            await self.sibs.release(sib, ctx_id)
            raise
        except SiblingDownError as e:
            if e.status == 404:  # its hand-off expired: a lost prompt, not a dead sibling
                raise SiblingError(f"KV no longer held: {e}") from None
            raise
        blob = res.content
        try:
            await asyncio.to_thread(kv_check.check_blob, blob, self.layout, tokens)
        except kv_wire.KvWireError as e:
            raise SiblingDownError(f"bad KV: {e}") from None
        self.sibs.stats.observe_transfer(len(blob), time.perf_counter() - t0)
        return blob

    async def stream(self, sib: Sibling, ctx_id: str, req: GenerateRequest) -> KvPayload:
        """The HTTP path: the staged region as kv_stream frames, read on a thread into this
        API server's receive arena (or one buffer), checked as it comes (the header against
        the prompt before any payload; the digest hashed on another thread)."""
        t0 = time.perf_counter()
        layout, tokens = self.layout, len(req.prompt_token_ids)
        url = f"{sib.url}{wire.kv_v2_path(ctx_id)}"
        headers = {**dict(req.trace_headers), **self.sibs.auth}
        deadline = self.sibs.timeout
        pull = kv_stream.KvPull(url, headers, kv_check.max_blob_bytes(layout, tokens), deadline)
        placed: list[KvRegion] = []
        frame: list[bytearray] = []

        def place(region: KvRegion) -> memoryview:
            spot = self.receive.place(req.request_id, region)
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
                self.receive.free(req.request_id)
                raise
        except TimeoutError:
            raise SiblingError(f"GET {url} took more than {deadline:g} s") from None
        except kv_stream.KvPullError as e:
            raise SiblingError(str(e)) from None
        except kv_wire.KvWireError as e:
            raise SiblingDownError(f"bad KV: {e}") from None
        self.sibs.stats.observe_transfer(region.nbytes, time.perf_counter() - t0)
        if placed:
            return KvPayload(placed[0])
        return KvPayload(region, frame[0])

    async def read_nixl(
        self, sib: Sibling, ctx_id: str, region: KvRegion, req: GenerateRequest
    ) -> KvPayload:
        """The NIXL path (kv_nixl.py): one READ of the staged region into the receive arena;
        a region that does not fit there is streamed as over HTTP. NixlReadError if it fails."""
        t0 = time.perf_counter()

        async def fetch(arena: str) -> bytes:
            return (await self.sibs.call("GET", sib, wire.nixl_path(arena), None, ())).content

        try:
            mine = await kv_nixl.pull(
                self._nixl, sib.url, region, self.receive, req.request_id, fetch,
                self.sibs.timeout,
            )  # fmt: skip
        except kv_nixl.NixlError as e:
            raise NixlReadError(f"NIXL: {e}") from None
        if mine is None:
            return await self.stream(sib, ctx_id, req)
        self.sibs.stats.observe_transfer(region.nbytes, time.perf_counter() - t0)
        return KvPayload(mine)
