"""The engine core's host time a step at N running, stage by stage, with a model too small to
matter: what bounds a serving core whose device is fast (issue 39, item 2: the 135M at 256).

A one-layer, 64-wide Llama (random weights, written to a temporary folder) keeps the device's
work near zero, so a step's wall time is the host's: the EngineCore driven as its loop drives it
(step, batch, the batch encoded for the socket), N requests in steady decode, then --reps
windows of --steps steps. Each stage's time is summed around its call (schedule, StepBatch.build,
backend.forward's launch, sampler.sample, the resolve of the step before, commit, the batch);
the report is the window with the median step. On CUDA the step path is the real one (graph
replay, the Triton sampler, depth 1); on the CPU the forward is computed and is left out of
`host_ms`. Compare trees on one machine, rounds interleaved.

  python -m bench.host_step --device cuda --running 256
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.offline import engine_config_from, random_prompts
from bench.profile_step import add_all, host_rows, one_iteration
from bench.profile_step import parser as step_parser
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.protocol import SamplingParams
from trtllm_gateway.engine.transport.loop import settle_heap
from trtllm_gateway.engine.transport.messages import Add, encode

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "num_hidden_layers": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def parser() -> argparse.ArgumentParser:
    p = step_parser()
    p.description = __doc__
    p.add_argument("--reps", type=int, default=5, help="windows of --steps steps")
    p.add_argument(
        "--churn",
        action="store_true",
        help="requests end after --output-len tokens and a new prompt of --input-len takes "
        "each one's place (a served run's joins, prefills and finishes), their starts staggered",
    )
    p.add_argument(
        "--shape",
        choices=["tiny", "model"],
        default="tiny",
        help="tiny: the one-layer model, the host alone; model: --model's own shape (its "
        "forward's launches and a mixed step's prefill are the real ones)",
    )
    p.add_argument(
        "--cprofile",
        type=int,
        default=0,
        help="N > 0: one more window under cProfile, its N functions of most self time a step",
    )
    p.set_defaults(input_len=64, output_len=4096, max_model_len=4352, steps=60, load_format="dummy")
    return p


class _Timed:
    """Seconds spent in each wrapped call, by stage."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, obj: Any, name: str, stage: str) -> None:
        inner: Callable[..., Any] = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = self.spent
                spent[stage] = spent.get(stage, 0.0) + time.perf_counter() - t

        setattr(obj, name, timed)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        if args.shape == "tiny":
            model = Path(d) / "tiny.json"
            model.write_text(json.dumps(TINY))
            args.model = str(model)
        core = EngineCore(BuiltinConfig(engine_config_from(args)))
        core.load(lambda _: None)
    settle_heap()
    if not args.churn:
        add_all(core, args)
    pipe = core._st.pipeline
    clock = _Timed()
    clock.wrap(pipe.scheduler, "schedule", "schedule")
    clock.wrap(pipe.scheduler, "commit", "commit")
    clock.wrap(pipe.backend, "forward", "forward")
    clock.wrap(pipe.sampler, "sample", "sample")
    clock.wrap(pipe, "_resolve", "resolve")
    clock.wrap(core, "batch", "batch")
    clock.wrap(StepBatch, "build", "build")  # a classmethod: called on the class, bound
    # The steady step's stages (scheduler.DecodeRows), where the tree has them.
    for obj, name, stage in [
        (pipe.scheduler, "schedule_decodes", "schedule"),
        (pipe.scheduler, "commit_decodes", "commit"),
        (StepBatch, "of_decodes", "build"),
    ]:
        if hasattr(obj, name):
            clock.wrap(obj, name, stage)
    counts: dict[str, int] = {}
    step = _churn(core, args, counts) if args.churn else partial(one_iteration, core, counts)
    if args.churn:
        # The first prompts' prefills, then --output-len steps: every first request has ended
        # and the joins run at their steady rate (joining requests keep counts' minimum low).
        while core._st.scheduler.waiting:
            step()
        for _ in range(args.output_len):
            step()
    while not args.churn and (
        len(counts) < args.running or min(counts.values()) < args.warm_tokens
    ):
        step()
    windows = []
    for _ in range(args.reps):
        clock.spent = {}
        t = time.perf_counter()
        tokens = sum(step() for _ in range(args.steps))
        wall = time.perf_counter() - t
        windows.append((wall, tokens, dict(clock.spent)))
    functions = None
    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            step()
        prof.disable()
        functions = host_rows(prof, args.steps, args.cprofile)
    on_cpu = core.steps_on_cpu
    windows.sort(key=lambda w: w[0] - (w[2].get("forward", 0.0) if on_cpu else 0.0))
    wall, tokens, spent = windows[len(windows) // 2]
    per = 1e3 / args.steps
    host = wall - (spent.get("forward", 0.0) if on_cpu else 0.0)
    return {
        "device": "cpu" if on_cpu else "cuda",
        "running": args.running,
        "step_ms": round(wall * per, 3),
        "host_ms": round(host * per, 3),
        "tokens_per_step": tokens / args.steps,
        "stages_ms": {k: round(v * per, 3) for k, v in sorted(spent.items())},
        "step_ms_all": sorted(round(w[0] * per, 3) for w in windows),
        "median_of": len(windows),
        "step_ms_spread": round(statistics.pstdev(w[0] * per for w in windows), 3),
        "functions_by_self_time": functions,
    }


def _churn(core: EngineCore, args: argparse.Namespace, counts: dict[str, int]) -> Callable[[], int]:
    """A step that replaces each finished request with a new prompt. The first requests' lengths
    are staggered over 1..--output-len, so that about running / output_len end a step, as in a
    served run's steady state, not all in one step."""
    vocab = core.info.vocab_size
    started = [0]

    def add(n: int, max_tokens: int) -> None:
        prompts = random_prompts(n, args.input_len, vocab, args.seed + started[0])
        for prompt in prompts:
            sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            request_id = f"churn-{started[0]}"
            started[0] += 1
            core.handle(Add(request_id=request_id, prompt_token_ids=prompt, sampling=sp), [])

    for i in range(args.running):
        add(1, 1 + i * args.output_len // args.running)

    def step() -> int:
        core.step()
        batch = core.batch()
        encode(batch)
        ended = 0
        for request_id, ev in batch.events:
            counts[request_id] = counts.get(request_id, 0) + len(ev.token_ids)
            if ev.finish_reason is not None:
                counts.pop(request_id)
                ended += 1
        add(ended, args.output_len)
        return sum(len(ev.token_ids) for _, ev in batch.events)

    return step


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(run(parser().parse_args())))


if __name__ == "__main__":
    main()
