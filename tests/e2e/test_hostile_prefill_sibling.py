"""A hostile prefill sibling (it holds the internal key) in front of a real decode instance on
SmolLM2, beside victims (issue 40, item 6). The sibling answers the context phase, then serves
KV that is NaN, a body far past the prompt's size, a byte a second, or first token ids outside
the vocabulary. Before the fix: the NaN KV was imported and cached, so the attacker's answer and
a later local request sharing its prefix came back wrong; the oversized body was pulled whole
and the request got a 400; the drip outlived --remote-prefill-timeout; the bad first tokens were
a 400. Now each is a sibling fault: the request prefills locally and gets the answer an
aggregated instance gives, and the victims keep theirs."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.e2e.ops_client import INTERNAL_AUTH, INTERNAL_KEY, MODEL
from tests.e2e.server import Server, free_port
from tests.e2e.victims import alone, victims
from trtllm_gateway.engine.disagg import kv_wire
from trtllm_gateway.engine.disagg.kv_check import KvShape

DEADLINE_S = 4.0  # the decode side's --remote-prefill-timeout
# Long enough to go to the sibling (--max-local-prefill-tokens 64); its follow-up shares it.
STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman " * 6
FOLLOW_UP = STORY + "One morning he"


class HostileSibling:
    """A prefill sibling's three endpoints, answering as `mode` says."""

    def __init__(self, model: str, kv_layout: str) -> None:
        self.model, self.kv_layout, self.mode = model, kv_layout, "nan"
        self.shape = KvShape.of(kv_layout)
        assert self.shape is not None
        self.tokens = 0
        self.bytes_sent = 0
        self.port = free_port()
        app = Starlette(
            routes=[
                Route("/health", self.health),
                Route("/internal/v1/info", self.info),
                Route("/internal/v1/prefill", self.prefill, methods=["POST"]),
                Route("/internal/v1/kv/{ctx}", self.kv, methods=["GET", "DELETE"]),
            ]
        )
        config = uvicorn.Config(app, port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HostileSibling:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    async def info(self, request: Request) -> Response:
        return JSONResponse(
            {"protocol_version": 1, "model": self.model, "kv_layout": self.kv_layout}
        )

    async def prefill(self, request: Request) -> Response:
        body = await request.json()
        self.tokens = len(body["prompt_token_ids"])
        first = [10**7] if self.mode == "bad_first" else [198]
        state = base64.b64encode(b"state").decode()
        return JSONResponse(
            {
                "first_token_ids": first,
                "prompt_tokens": self.tokens,
                "disaggregated_params": {
                    "ctx_request_id": body["request_id"],
                    "opaque_state": state,
                },
            }
        )

    def _blob(self, fill: float) -> bytes:
        assert self.shape is not None
        shape = self.shape.tensor(self.tokens)
        data = np.full(shape, fill, dtype=np.float32).tobytes()
        header = {
            "kv_layout": self.kv_layout,
            "dtype": self.shape.dtype,
            "shape": shape,
            "block_size": 16,
            "num_tokens": self.tokens,
        }
        return kv_wire.encode(header, data)

    async def kv(self, request: Request) -> Response:
        if request.method == "DELETE":
            return JSONResponse({})
        self.bytes_sent = 0
        if self.mode == "nan":
            return Response(self._blob(float("nan")))
        if self.mode == "bad_first":
            return Response(self._blob(0.0))
        if self.mode == "huge":
            return StreamingResponse(self._huge(request))
        return StreamingResponse(self._drip(self._blob(0.0)))

    async def _huge(self, request: Request) -> AsyncIterator[bytes]:
        for _ in range(256):  # 256 MiB, no Content-Length, until the puller hangs up
            if await request.is_disconnected():
                return
            self.bytes_sent += 1 << 20
            yield b"\0" * (1 << 20)

    async def _drip(self, blob: bytes) -> AsyncIterator[bytes]:
        for byte in blob:
            self.bytes_sent += 1
            yield bytes([byte])
            await asyncio.sleep(1.0)


@pytest.fixture(scope="module")
def sibling(server: Server) -> Iterator[HostileSibling]:
    """Posing as a sibling of the aggregated server's model and layout."""
    info = httpx.get(f"{server.url}/internal/v1/info", headers=INTERNAL_AUTH, timeout=30).json()
    sib = HostileSibling(info["model"], info["kv_layout"]).start()
    yield sib
    sib.stop()


@pytest.fixture(scope="module")
def decode(sibling: HostileSibling, log_dir: Path) -> Iterator[Server]:
    args = ["--mode", "decode", "--prefill-url", sibling.url, "--num-kv-blocks", "512"]
    args += ["--internal-api-key", INTERNAL_KEY, "--max-local-prefill-tokens", "64"]
    args += ["--remote-prefill-timeout", str(DEADLINE_S), "--sibling-backoff", "0.1"]
    srv = Server(args=args).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def completion(prompt: str) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}


async def text(client: httpx.AsyncClient, url: str, prompt: str) -> str:
    r = await client.post(f"{url}/v1/completions", json=completion(prompt))
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


@pytest.mark.parametrize("mode", ["nan", "huge", "drip", "bad_first"])
async def test_a_hostile_sibling_costs_a_local_prefill(
    mode: str, server: Server, decode: Server, sibling: HostileSibling
) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        expected = await alone(client, server.url)
        sibling.mode = mode
        before = decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="local_fallback"')
        beside = asyncio.create_task(victims(client, decode.url))
        t0 = time.monotonic()
        # A prompt of its own per mode, so that no earlier mode's KV is cached for it.
        got = await text(client, decode.url, f"[{mode}] {STORY}")
        took = time.monotonic() - t0
        assert await beside == expected
        after = decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="local_fallback"')
        assert after == before + 1, decode.log()
        assert got == await text(client, server.url, f"[{mode}] {STORY}")
        if mode == "nan":
            # The prefix cache holds the local prefill's KV, not the sibling's NaN.
            assert got.strip(), got
            assert await text(client, decode.url, f"[{mode}] {FOLLOW_UP}") == await text(
                client, server.url, f"[{mode}] {FOLLOW_UP}"
            )
        if mode == "huge":
            assert sibling.bytes_sent < 64 << 20, sibling.bytes_sent  # cut near the cap (~5 MB)
        if mode == "drip":
            assert took < DEADLINE_S + 20, took
