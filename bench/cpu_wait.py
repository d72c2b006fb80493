"""OpenMP waiting policies A/B: batch-B decode steps in one engine process per policy, interleaved.

libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when torch loads it, so each candidate
environment gets a process of its own (`--worker`): it loads the engine, prefills B random
128-token prompts and then, on each command, runs decode steps or sits idle. The driver runs the
candidates round by round in a rotating order, each one alone: the others are frozen with SIGSTOP
(a spinning OpenMP thread of an idle candidate would take the core the measured one needs). Per
candidate: ms a decode step (median of the rounds' medians), the process's CPU time in the
`--idle-s` seconds after its steps (what its threads burn spinning once the work stops), and the
run-queue wait share (run_queue.py) of its steps, with the load.

  python -m bench.cpu_wait --batch 1 --rounds 4 --steps 20 \\
      --policy PASSIVE --policy default --policy default,GOMP_SPINCOUNT=30000 --policy ACTIVE
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def policy_env(spec: str) -> dict[str, str]:
    """'PASSIVE' / 'ACTIVE' / 'default' (unset: spin GOMP_SPINCOUNT, then sleep), optionally
    followed by ',NAME=VALUE' pairs; every OpenMP wait variable not named is removed."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    head, *extra = spec.split(",")
    if head != "default":
        env["OMP_WAIT_POLICY"] = head
    for pair in extra:
        name, value = pair.split("=", 1)
        env[name] = value
    return env


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def worker(batch: int, thread_policy: str) -> None:
    from bench.offline import random_prompts
    from trtllm_gateway.config.engine import EngineConfig
    from trtllm_gateway.engine.builtin import cpu_threads
    from trtllm_gateway.engine.builtin.config import BuiltinConfig
    from trtllm_gateway.engine.builtin.loader import load
    from trtllm_gateway.engine.builtin.parts import assemble
    from trtllm_gateway.engine.builtin.run_queue import RunQueueWait, waited_ns
    from trtllm_gateway.engine.kv_events.log import KvEventLog
    from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams

    class Pinned(RunQueueWait):
        def share(self) -> float | None:
            return None

    engine = EngineConfig(device="cpu", dtype="float32")
    parts = assemble(load(engine), BuiltinConfig(engine), KvEventLog(engine.block_size))
    st = parts.stepper
    sp = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(random_prompts(batch, 128, parts.info.vocab_size, 0)):
        st.add(parts.sequences.build(GenerateRequest(f"s{i}", p, sp)))
    for _ in range(3):
        st.step()
    if thread_policy != "auto":
        cpu_threads.POLICY = cpu_threads.ThreadPolicy(Pinned())
        cpu_threads.POLICY.contended = thread_policy == "contended"
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, arg = line.split()
        if cmd == "steps":
            ms, w0, t0 = [], waited_ns() or 0, time.perf_counter()
            for _ in range(int(arg)):
                s = time.perf_counter()
                st.step()
                ms.append((time.perf_counter() - s) * 1e3)
            wall = time.perf_counter() - t0
            wait = ((waited_ns() or 0) - w0) / 1e9 / wall
            out: dict[str, Any] = {"ms": ms, "wait_share": round(wait, 2)}
        else:  # idle
            c0 = _cpu_s()
            time.sleep(float(arg))
            out = {"idle_cpu_s": _cpu_s() - c0}
        print(json.dumps(out), flush=True)


def _ask(proc: subprocess.Popen[str], cmd: str) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(cmd + "\n")
    proc.stdin.flush()
    while not (line := proc.stdout.readline()).startswith("{"):  # past the loader's prints
        if not line:
            raise RuntimeError("the worker exited")
    result: dict[str, Any] = json.loads(line)
    return result


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def drive(args: argparse.Namespace) -> None:
    procs = {}
    for spec in args.policy:
        cmd = [sys.executable, "-m", "bench.cpu_wait", "--worker", "--batch", str(args.batch)]
        cmd += ["--thread-policy", args.thread_policy]
        proc = subprocess.Popen(cmd, env=policy_env(spec), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.stdout is not None
        while (line := proc.stdout.readline()).strip() != "ready":
            if not line:
                raise RuntimeError(f"{spec}: the worker did not start")
        os.kill(proc.pid, signal.SIGSTOP)
        procs[spec] = proc
    rows: dict[str, dict[str, list[Any]]] = {s: {"ms": [], "idle": [], "wait": []} for s in procs}
    try:
        for r in range(args.rounds):
            order = args.policy[r % len(args.policy) :] + args.policy[: r % len(args.policy)]
            for spec in order:
                proc = procs[spec]
                os.kill(proc.pid, signal.SIGCONT)
                load = _load()
                res = _ask(proc, f"steps {args.steps}")
                idle = _ask(proc, f"idle {args.idle_s}")
                os.kill(proc.pid, signal.SIGSTOP)
                rows[spec]["ms"].append(statistics.median(res["ms"]))
                rows[spec]["idle"].append(idle["idle_cpu_s"])
                rows[spec]["wait"].append(res["wait_share"])
                line = {"round": r, "policy": spec, "median_ms": rows[spec]["ms"][-1]}
                line |= {"idle_cpu_s": round(idle["idle_cpu_s"], 3)}
                line |= {"wait_share": res["wait_share"], "load": load}
                print(json.dumps(line), flush=True)
    finally:
        for proc in procs.values():
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            proc.wait(30)
    for spec, row in rows.items():
        summary = {
            "policy": spec,
            "batch": args.batch,
            "thread_policy": args.thread_policy,
            "step_ms_median": round(statistics.median(row["ms"]), 2),
            "step_ms_rounds": [round(x, 2) for x in row["ms"]],
            f"cpu_s_in_{args.idle_s:g}s_after": [round(x, 3) for x in row["idle"]],
            "wait_share": row["wait"],
        }
        print(json.dumps(summary), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--policy", action="append", default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--idle-s", type=float, default=1.0)
    p.add_argument("--thread-policy", choices=["auto", "free", "contended"], default="auto")
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    if args.worker:
        worker(args.batch, args.thread_policy)
        return
    args.policy = args.policy or ["PASSIVE", "default", "ACTIVE"]
    drive(args)


if __name__ == "__main__":
    main()
