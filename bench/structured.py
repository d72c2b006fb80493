"""TPOT with a json_schema constraint vs unconstrained, on the built-in engine, in one run.

Offline (no HTTP): the same chat prompt at temperature 0.8, seeded, `--conc` requests at once,
the two modes interleaved `--rounds` times so a noisy shared CPU hurts both alike. Every request
of both modes decodes exactly max_tokens (unconstrained with ignore_eos; the schema cannot be
completed sooner), so both run at the same batch size throughout. TPOT of a
request is its decode time over its output tokens after the first (the engine's own timings);
the table gives the median over requests of each cell.

  python -m bench.structured --conc 1 32 --max-tokens 64 --rounds 2 [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.model_source import resolve_model
from trtllm_gateway.engine.protocol import (
    GenerateRequest,
    GuidedDecoding,
    SamplingParams,
    TokenEvent,
)
from trtllm_gateway.engine.transport.client import CoreClient

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 6},
        # Long enough that no answer completes within the benchmark's max_tokens, so both modes
        # decode every request to max_tokens at a full batch (the free ones with ignore_eos).
        "bio": {"type": "string", "minLength": 400},
    },
    "required": ["name", "age", "role", "address", "tags", "bio"],
}
PROMPT = "Describe a person as JSON with name, age, role, address and tags."


def chat_prompt() -> tuple[int, ...]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(resolve_model("default")))
    text = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
    )
    return tuple(tok.encode(text, add_special_tokens=False))


async def one(engine: CoreClient, req: GenerateRequest) -> tuple[float, int]:
    last: TokenEvent | None = None
    async for ev in engine.generate(req):
        last = ev
    assert last is not None and last.usage is not None and last.timings is not None
    n = last.usage.completion_tokens
    return (last.timings.decode_s / (n - 1) if n > 1 else float("nan")), n


async def cell(
    engine: CoreClient,
    prompt: tuple[int, ...],
    conc: int,
    guided: bool,
    max_tokens: int,
    tag: str,
) -> list[tuple[float, int]]:
    g = GuidedDecoding("json", json.dumps(SCHEMA)) if guided else None
    reqs = [
        GenerateRequest(
            f"{tag}-{i}",
            prompt,
            SamplingParams(
                max_tokens=max_tokens, temperature=0.8, seed=i, guided=g, ignore_eos=not guided
            ),
        )
        for i in range(conc)
    ]
    return list(await asyncio.gather(*(one(engine, r) for r in reqs)))


async def main(args: argparse.Namespace) -> None:
    engine = core_client(BuiltinConfig(EngineConfig(device=args.device)), in_thread=True)
    await engine.start()
    prompt = chat_prompt()
    await cell(engine, prompt, 2, True, 8, "warm")
    await cell(engine, prompt, 2, False, 8, "warmf")
    rows = []
    for conc in args.conc:
        tpot: dict[bool, list[float]] = {False: [], True: []}
        toks: dict[bool, list[int]] = {False: [], True: []}
        for r in range(args.rounds):
            for guided in (False, True):
                res = await cell(
                    engine, prompt, conc, guided, args.max_tokens, f"{conc}-{r}-{guided}"
                )
                tpot[guided] += [t for t, n in res if n > 1]
                toks[guided] += [n for _, n in res]
        free, cons = statistics.median(tpot[False]), statistics.median(tpot[True])
        rows.append(
            {
                "concurrency": conc,
                "tpot_ms_unconstrained": round(free * 1e3, 2),
                "tpot_ms_json_schema": round(cons * 1e3, 2),
                "slowdown_pct": round((cons / free - 1) * 100, 1),
                "mean_tokens_unconstrained": round(statistics.mean(toks[False]), 1),
                "mean_tokens_json_schema": round(statistics.mean(toks[True]), 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    await engine.stop()
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": args.device}
    print(json.dumps({"run": info, "rows": rows}))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conc", type=int, nargs="+", default=[1, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="cpu")
    asyncio.run(main(p.parse_args()))
