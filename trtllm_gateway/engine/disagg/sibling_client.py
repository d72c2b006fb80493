"""SiblingClient: a decode instance's HTTP exchanges with its prefill siblings, and what their
failures mean (engine/disagg/remote_prefill.py decides what to do about them).

Every exchange carries the internal key (never a client's) and the request's trace context, runs
within --remote-prefill-timeout and reads its body to a cap. A 503 is busy (SiblingBusyError,
with the sibling's queue), never down; a timeout is down only if the sibling's /health does not
answer either; a refused or reset connection, another status or a body past its cap is down
(SiblingDownError). The hand-off lease is renewed while a KV pull waits (leased).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.disagg.siblings import Sibling
from trtllm_gateway.engine.stats import RemotePrefillStats


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


class SiblingMismatchError(Exception):
    """A sibling serves another model or KV layout: a configuration error, never a fallback."""


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


class SiblingClient:
    def __init__(
        self,
        timeout: float,
        auth: dict[str, str],
        stats: RemotePrefillStats,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: httpx.MockTransport
    ) -> None:
        self.timeout = timeout  # --remote-prefill-timeout
        self.auth = auth  # the internal key's header
        self.stats = stats
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self.timeout, transport=self._transport)

    @property
    def http(self) -> httpx.AsyncClient:
        """The shared httpx client (KV-aware routing's followers use it too)."""
        assert self._client is not None, "SiblingClient.start() first"
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def call(
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
        url = f"{sib.url}{path}"
        headers = {**dict(trace), **self.auth}
        if content is not None:
            headers["Content-Type"] = "application/json"
        deadline = self.timeout
        try:
            async with asyncio.timeout(deadline):
                res = await self._exchange(method, url, headers, content, max_bytes)
        except (TimeoutError, httpx.TimeoutException):
            # Slow is not dead: a sibling whose /health still answers is not marked.
            slow = f"{method} {path} took more than {deadline:g} s"
            raise (SiblingError if await self.healthy(sib) else SiblingDownError)(slow) from None
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
        client = self.http
        request = client.build_request(method, url, headers=headers, content=content)
        res = await client.send(request, stream=True)
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

    async def healthy(self, sib: Sibling) -> bool:
        """The sibling's /health answers 200 within 2 s."""
        try:
            async with asyncio.timeout(2.0):
                res = await self.http.get(f"{sib.url}/health", timeout=2.0)
            return res.status_code == 200
        except (httpx.HTTPError, TimeoutError):
            return False

    async def release(self, sib: Sibling, ctx_id: str) -> None:
        """Tell the sibling its held KV for ctx_id is no longer wanted (shielded, best effort)."""
        with contextlib.suppress(httpx.HTTPError):
            await asyncio.shield(
                self.http.delete(f"{sib.url}{wire.kv_path(ctx_id)}", headers=self.auth)
            )

    @contextlib.asynccontextmanager
    async def leased(self, sib: Sibling, ctx_id: str, lease_s: float) -> AsyncIterator[None]:
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
        url = f"{sib.url}{wire.lease_path(ctx_id)}"
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(httpx.HTTPError):  # the pull itself reports a failure
                res = await self.http.post(url, headers=self.auth, timeout=every)
                if res.status_code == 200:
                    self.stats.lease_renewals += 1
