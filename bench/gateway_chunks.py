"""One API server's cost a streamed chunk: the gateway alone, over a fake engine.

    python -m bench.gateway_chunks                       # 256 requests x 500 tokens, 64 at once
    python -m bench.gateway_chunks --tree /tmp/old-main  # the same for another checkout (A/B)

The server process runs the real app (create_app, uvicorn_config: the HTTP protocol, the SSE
response, the OpenAI renderers, metrics) over tests/fake_engine.py's FakeEngine, which answers
every token at once, so the server's one core is the limit; an aiohttp client in this process
reads the `data:` chunks of /v1/completions streams. Prints chunks a second and the server
process's CPU (% of one core). The client shares the machine: compare trees on one machine,
rounds interleaved, not figures across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

PORT = 18990


def serve(tree: str, tokens: int, port: int) -> None:
    sys.path.insert(0, tree)
    import uvicorn

    from tests.conftest import build_tokenizer_dir
    from tests.fake_engine import FakeEngine
    from trtllm_gateway.app.main import create_app
    from trtllm_gateway.app.server import uvicorn_config
    from trtllm_gateway.config.settings import Settings
    from trtllm_gateway.engine.protocol import EngineInfo
    from trtllm_gateway.engine.tokenizer import Tokenizer

    tok_dir = build_tokenizer_dir(Path(f"/tmp/gateway-chunks-tok-{os.getpid()}"))
    tok = Tokenizer.from_dir(tok_dir)
    eos = tok.eos_token_id
    assert eos is not None
    info = EngineInfo(
        model_id="m", max_model_len=1 << 16, vocab_size=tok.vocab_size, eos_token_ids=(eos,),
        engine="fake",
    )  # fmt: skip
    ids = tok.encode("hello world " * tokens, add_special_tokens=False)[:tokens]
    engine = FakeEngine(info, ids, tokenizer_dir=tok_dir)
    settings = Settings(
        model=str(tok_dir), served_model_name="m", max_model_len=1 << 16, port=port,
        log_level="warning",
    )  # fmt: skip
    parts = settings.parts()
    uvicorn.Server(uvicorn_config(create_app(parts, engine=engine), parts.server)).run()


async def client(port: int, streams: int, requests: int) -> tuple[int, float]:
    import aiohttp

    body = {"model": "m", "prompt": "hi", "max_tokens": 4000, "stream": True}
    chunks = 0
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            nonlocal chunks
            async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                async for line in r.content:
                    chunks += line.startswith(b"data: {")

        gate = asyncio.Semaphore(streams)

        async def gated() -> None:
            async with gate:
                await one()

        await one()  # warm-up
        chunks = 0
        t0 = time.perf_counter()
        await asyncio.gather(*[gated() for _ in range(requests)])
        return chunks, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--tokens", type=int, default=500)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--port", type=int, default=PORT)
    args = p.parse_args()
    import httpx
    import psutil

    server = mp.get_context("spawn").Process(
        target=serve, args=(args.tree, args.tokens, args.port), daemon=True
    )
    server.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{args.port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        proc = psutil.Process(server.pid)
        proc.cpu_percent()
        chunks, took = asyncio.run(client(args.port, args.streams, args.requests))
        cpu = proc.cpu_percent()
    finally:
        server.kill()
    print(
        f"{args.tree}: {chunks} chunks in {took:.2f} s = {chunks / took:,.0f} chunks/s, "
        f"server CPU {cpu:.0f}%"
    )


if __name__ == "__main__":
    main()
