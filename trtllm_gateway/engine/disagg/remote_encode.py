"""RemoteEncoder: a prefill or aggregated instance's client for sibling encode instances (EPD).

Images go to a sibling's POST /internal/v1/encode as embed_wire "pixels" frames; the sibling
streams back one "embeds" frame per image. Remote prefill's rules: least-outstanding sibling,
a failed one skipped for --sibling-backoff seconds, any sibling error or timeout means "encode
locally" (counted), and cancelling the caller cancels the HTTP request (the sibling sees the
disconnect). Engine-agnostic: frames in, frames out, no torch.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from trtllm_gateway.config.disagg import EncodeSiblings
from trtllm_gateway.engine.disagg.embed_wire import (
    CONTENT_TYPE,
    EmbedWireError,
    Frame,
    decode_frames,
)
from trtllm_gateway.engine.disagg.sibling_wire import ENCODE_PATH
from trtllm_gateway.engine.disagg.siblings import Sibling, SiblingPool, sibling_headers

logger = logging.getLogger(__name__)

OUTCOMES = ("remote", "local_fallback")


@dataclass
class RemoteEncodeStats:
    outcomes: Counter[str] = field(default_factory=Counter)  # one of OUTCOMES per batch

    def record(self, outcome: str) -> None:
        self.outcomes[outcome] += 1


class RemoteEncoder:
    @classmethod
    def from_siblings(cls, siblings: EncodeSiblings) -> RemoteEncoder:
        """--encode-url's siblings, presenting --internal-api-key (/internal/ takes only it)."""
        key = siblings.internal_key
        secret = key.get_secret_value() if key is not None else None
        return cls(siblings.urls, siblings.timeout, siblings.backoff, secret)

    def __init__(
        self, urls: Sequence[str], timeout: float, backoff: float, internal_key: str | None = None
    ) -> None:
        self.pool = SiblingPool(urls, backoff)
        self._auth = sibling_headers(internal_key)
        self.timeout = timeout
        self.stats = RemoteEncodeStats()
        self._client: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def encode(
        self,
        pixel_frames: Sequence[bytes],
        hashes: Sequence[str],
        layout: str,
        trace: tuple[tuple[str, str], ...] = (),
        check: Callable[[Sequence[Frame]], None] | None = None,
    ) -> list[Frame] | None:
        """Embedding frames in image order, or None: encode locally (the fallback is counted).

        trace: the request's W3C trace context, so the sibling's span is a child of ours.
        check: what the wire cannot check (finite values: embed_tensors.check_finite); its
        EmbedWireError is the sibling's fault, as a malformed frame is."""
        sib = self.pool.pick()
        if sib is None:
            self._fallback("no encode sibling is available")
            return None
        try:
            with self.pool.busy(sib):
                async with asyncio.timeout(self.timeout):
                    frames = await self._call(sib, pixel_frames, layout, trace)
            if [f.header.image_hash for f in frames] != list(hashes):
                raise _BadReply("it answered for other images")
            if check is not None:
                check(frames)
        except (TimeoutError, httpx.HTTPError, EmbedWireError, _BadReply) as e:
            self.pool.mark(sib, healthy=False)
            self._fallback(f"encode sibling {sib.url} failed: {type(e).__name__}: {e}")
            return None
        self.pool.mark(sib, healthy=True)
        self.stats.record("remote")
        return frames

    def _fallback(self, why: str) -> None:
        logger.warning("%s; encoding locally", why)
        self.stats.record("local_fallback")

    async def _call(
        self,
        sib: Sibling,
        pixel_frames: Sequence[bytes],
        layout: str,
        trace: tuple[tuple[str, str], ...],
    ) -> list[Frame]:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        headers = {**dict(trace), "Content-Type": CONTENT_TYPE, **self._auth}
        res = await self._client.post(
            f"{sib.url}{ENCODE_PATH}", content=b"".join(pixel_frames), headers=headers
        )
        if res.status_code != 200:
            raise _BadReply(f"answered {res.status_code}: {res.text[:200]}")
        return list(decode_frames(res.content, "embeds", expected_layout=layout))


class _BadReply(Exception):
    pass
