"""KvFollower: keeps a sibling's PrefixIndex current by reading its /internal/v1/kv-events stream.

One task per sibling. It resumes after the last event id it applied; a Hello from another
instance (the sibling restarted) or a Resync (it dropped events we had not read) empties the
index first. A sibling without events (404) is asked again only after a long pause; a broken
connection is retried after `retry` seconds. A stream that sends nothing (not even its
heartbeat) for SILENCE_S, or a line longer than MAX_LINE_BYTES, is dropped and opened again: a
sibling holds the internal key, yet one endless line grew the follower without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx

from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.disagg.prefix_index import PrefixIndex

logger = logging.getLogger(__name__)

NO_EVENTS_RETRY_S = 60.0
# The stream's heartbeat comes every 5 s (routers/internal/kv_events.py's default).
SILENCE_S = 30.0
# A BlockStored line carries its blocks' token ids: a 128k-token prompt is about 1 MB.
MAX_LINE_BYTES = 16 << 20


class KvFollower:
    def __init__(
        self,
        url: str,
        index: PrefixIndex,
        client: httpx.AsyncClient,
        headers: dict[str, str],
        retry: float = 2.0,
    ) -> None:
        self.url = url
        self.index = index
        self._client = client
        self._headers = headers
        self._retry = retry
        self.instance: str | None = None
        self.last_id = -1
        self.connected = asyncio.Event()  # set once a stream's Hello arrived (tests wait on it)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kv-follow {self.url}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            pause = self._retry
            try:
                pause = await self._follow()
            except (httpx.HTTPError, ValueError) as e:
                logger.debug("KV events of %s: %s; again in %.0fs", self.url, e, pause)
            await asyncio.sleep(pause)

    async def _follow(self) -> float:
        # The index matches prompts by their tokens; only a holder of the internal key gets them.
        params = {"after": str(self.last_id), "token_ids": "true"}
        url = f"{self.url}{wire.KV_EVENTS_PATH}"
        timeout = httpx.Timeout(30.0, read=SILENCE_S)
        async with self._client.stream(
            "GET", url, params=params, headers=self._headers, timeout=timeout
        ) as res:
            if res.status_code == 404:
                return NO_EVENTS_RETRY_S  # an engine without events (or a gateway without them)
            if res.status_code != 200:
                raise httpx.HTTPStatusError(f"{res.status_code}", request=res.request, response=res)
            async for line in _lines(res):
                if line and self._line(wire.decode_line(line)):
                    return 0.0  # read the new instance from its first event
        return self._retry

    def _line(self, line: wire.StreamLine) -> bool:
        """Apply one line; True when the stream must be opened again from the start."""
        if isinstance(line, wire.Hello):
            if line.instance != self.instance:
                if self.instance is not None:
                    logger.info("prefill sibling %s restarted: its KV index starts over", self.url)
                self.index.clear()
                self.instance = line.instance
                if self.last_id != -1:
                    self.last_id = -1
                    return True
            self.connected.set()
        elif isinstance(line, wire.Resync):
            self.index.clear()
        elif isinstance(line, wire.KvEventLine):
            self.index.apply(line.event)
            if line.event_id is not None:
                self.last_id = line.event_id
        return False


async def _lines(res: httpx.Response) -> AsyncIterator[bytes]:
    """The stream's lines; ValueError for one past MAX_LINE_BYTES (httpx's aiter_lines buffers
    a line of any length)."""
    pending = bytearray()
    async for chunk in res.aiter_bytes():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            yield bytes(pending)
            pending.clear()
            start = end + 1
        pending += chunk[start:]
        if len(pending) > MAX_LINE_BYTES:
            raise ValueError(f"a KV events line longer than {MAX_LINE_BYTES} bytes")
    if pending:
        yield bytes(pending)
