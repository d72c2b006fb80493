#!/usr/bin/env bash
# A/B of two source trees served on one GPU, rounds interleaved: the 135M shape (dummy weights),
# NUM requests of LEN/LEN at concurrency 256, one token per chunk, --api-server-count N.
# Run on the device from the repository root, with the other tree carried beside it:
#   git worktree add .basetree <commit>        # here; carry [".whl", ".basetree"]
#   BASE=.basetree ROUNDS=2 API_SERVERS=4 bash bench/ab_serve.sh      # there
# One line per run (tree, output tok/s, the core's main thread %, and the core's StepClock: each
# stage's wall / CPU ms a step, logged at info when it stops); the median of the pairwise
# ratios (this tree over BASE) at the end. API_SERVERS=auto serves this tree with its default
# count; BASE_API_SERVERS (default API_SERVERS) is the base tree's. Logs under $OUT/ab.
# PYSPY=<py-spy binary>: 10 s of the engine core's and the first API server's stacks mid-run
# (spy_core_<run>.txt, spy_api_<run>.txt);
# NEW_ONLY=1: this tree alone. SERVER_CPUS / CLIENT_CPUS (taskset lists, e.g. 0-15 / 16-31 on a
# 32-core host): the server as on a host of that many cores, the load generator (WORKERS
# processes, default 8) on cores of its own, so neither takes the other's. SERVER_CPUS=half: the
# first half of the physical cores with their hyperthreads, the load generator the rest
# (bench/cpu_split.py; on a host whose CPU i and i + 16 are siblings, 0-15 / 16-31 is not a split). NEW_ARGS / BASE_ARGS:
# CORE_CPUS=own: the engine core pinned to the first physical core (with its hyperthreads), every
# other server process and the load generator to the rest, once it serves.
# serve flags for one side only (BASE=. with NEW_ARGS="--kv-cache-dtype fp8": a flag's A/B).
# CLIENT (aiohttp or httpx, default aiohttp): bench.serve's HTTP client; BASE_CLIENT the base
# side's (BASE=. BASE_CLIENT=httpx: the load generator's own A/B on one tree).
# Each run's steady_chunks_s: chunks a second while every lane was busy (bench.serve's `steady`,
# the run's ramp and drain left out); the pairs' ratios of it are printed beside output_tok_s's.
set -u
BASE=${BASE:-.basetree}
ROUNDS=${ROUNDS:-2}
API_SERVERS=${API_SERVERS:-4}
BASE_API_SERVERS=${BASE_API_SERVERS:-$API_SERVERS}
NUM=${NUM:-512}
LEN=${LEN:-1024}
MODEL=${MODEL:-trtllm_gateway/config/models/smollm2-135m.json}
TOK=${TOK:-.whl/tok}
OUT=${OUT:-/tmp/out}
PORT=8124
URL=http://127.0.0.1:$PORT
HERE=$(pwd)
mkdir -p "$OUT/ab"
if [[ "${CORE_CPUS:-}" == own ]]; then  # the engine core on a physical core of its own
  read -r CORE_CPUS CLIENT_CPUS < <(python3 -m bench.cpu_split --core)
  echo "engine core on CPUs $CORE_CPUS, the rest (API servers, load generator) on $CLIENT_CPUS" >&2
fi
if [[ "${SERVER_CPUS:-}" == half ]]; then
  read -r SERVER_CPUS CLIENT_CPUS < <(python3 -m bench.cpu_split)
  echo "server on CPUs $SERVER_CPUS, load generator on $CLIENT_CPUS" >&2
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

one() {  # one TREE NAME COUNT [FLAGS [CLIENT]]: serve from TREE, load it from this tree, a JSON line
  local tree=$1 name=$2 count=$3 extra=${4:-} loadgen=${5:-aiohttp} servers=()
  [[ "$count" == auto ]] || servers=(--api-server-count "$count")
  local pin_server=() pin_client=()
  [[ -z "${SERVER_CPUS:-}" ]] || pin_server=(taskset -c "$SERVER_CPUS")
  [[ -z "${CLIENT_CPUS:-}" ]] || pin_client=(taskset -c "$CLIENT_CPUS")
  (cd "$tree" && PYTHONPATH=/tmp/site:. exec "${pin_server[@]}" python3 -m trtllm_gateway serve --model "$HERE/$MODEL" \
    --load-format dummy --max-model-len 2304 --max-num-tokens 8192 --max-batch-size 256 \
    --tokenizer "$HERE/$TOK" --port $PORT "${servers[@]}" $extra \
    --log-level info) > "$OUT/ab/server_$name.log" 2>&1 &
  local server=$!
  python3 -c "from bench.serve import wait_ready; wait_ready('$URL', 300)" || {
    echo "{\"run\": \"$name\", \"error\": \"no start\"}"; kill $server; wait $server; return; }
  timeout 300 "${pin_client[@]}" python3 -m bench.serve --base-url $URL --num-prompts "$NUM" \
    --input-len "$LEN" --output-len "$LEN" --max-concurrency 256 --workers "${WORKERS:-8}" --client "$loadgen" > "$OUT/ab/serve_$name.json" \
    2> "$OUT/ab/serve_$name.err" &
  local client=$!
  if [[ -n "${CORE_CPUS:-}" ]]; then  # every server process but the core off the core's CPUs
    local pid
    for pid in $server $(pgrep -P $server); do
      if pgrep -f trtllm_gateway.engine.transport.process | grep -qx "$pid"; then
        taskset -a -p -c "$CORE_CPUS" "$pid" > /dev/null
      else
        taskset -a -p -c "$CLIENT_CPUS" "$pid" > /dev/null
      fi
    done
  fi
  python3 -m bench.proc_sample --pid $server --client-pid $client --metrics-url $URL/metrics \
    > "$OUT/ab/samples_$name.jsonl" 2>/dev/null &
  local sampler=$!
  if [[ -n "${PYSPY:-}" ]]; then
    sleep "${SPY_AT:-8}"
    local core
    core=$(pgrep -P $server -f trtllm_gateway.engine.transport.process | head -1)
    [[ -n "$core" ]] && "$PYSPY" record --pid "$core" --duration 10 --rate 100 --nonblocking \
      --format raw -o "$OUT/ab/spy_core_$name.txt" > /dev/null 2>&1 &
    local api
    api=$(pgrep -P $server -f trtllm_gateway.app.api_server | head -1)
    [[ -n "$api" ]] && "$PYSPY" record --pid "$api" --duration 10 --rate 100 --nonblocking \
      --format raw -o "$OUT/ab/spy_api_$name.txt" > /dev/null 2>&1 &
  fi
  wait $client
  local kids
  kids=$(pgrep -P $server)
  kill $sampler $server; wait $sampler $server 2>/dev/null
  for _ in $(seq 60); do [[ -z "$kids" ]] || ! kill -0 $kids 2>/dev/null && break; sleep 0.5; done
  python3 - "$name" "$tree" "$OUT/ab" <<'EOF'
import json, re, sys
from pathlib import Path
from bench.proc_sample import summary
name, tree, d = sys.argv[1], sys.argv[2], Path(sys.argv[3])
r = json.loads((d / f"serve_{name}.json").read_text())
s = summary(d / f"samples_{name}.jsonl")
log = (d / f"server_{name}.log").read_text(errors="replace").splitlines()
clock = [line.split("thread: ", 1)[-1] for line in log if " steps (" in line]
# StepClock's "every step: decode N steps, X sequences ...": how full the decode steps ran
full = re.search(r"every step: .*?decode (\d+) steps, ([\d.]+) sequences", clock[-1] if clock else "")
steady = r.get("steady") or {}  # chunks a second while every lane was busy (bench.serve)
print(json.dumps({"run": name, "tree": tree, "output_tok_s": round(r["output_throughput"]),
                  "steady_chunks_s": round(steady["chunk_throughput"]) if steady else None,
                  "client_cpu_pct": s.get("client_cpu"),
                  "ok": r["completed"], "failed": r["failed"],
                  "core_main_pct": s.get("core_main"), "core_cpu_pct": s.get("core_cpu"),
                  "api_main_pct": s.get("api_main"),
                  "decode_steps": int(full[1]) if full else None,
                  "seqs_a_decode_step": float(full[2]) if full else None,
                  "step_clock": clock[-1] if clock else None}))
EOF
}

for r in $(seq "$ROUNDS"); do
  [[ -n "${NEW_ONLY:-}" ]] || one "$BASE" "base$r" "$BASE_API_SERVERS" "${BASE_ARGS:-}" \
    "${BASE_CLIENT:-${CLIENT:-aiohttp}}" | tee -a "$OUT/ab/runs.jsonl"
  one . "new$r" "$API_SERVERS" "${NEW_ARGS:-}" "${CLIENT:-aiohttp}" | tee -a "$OUT/ab/runs.jsonl"
done
python3 - "$OUT/ab/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
for key in ("output_tok_s", "steady_chunks_s"):
    tok = {r["run"]: r.get(key) for r in runs}
    ratios = [tok[f"new{i}"] / tok[f"base{i}"] for i in range(1, len(runs) // 2 + 1)
              if tok.get(f"new{i}") and tok.get(f"base{i}")]
    if ratios:
        print(f"new / base, {key}: median {statistics.median(ratios):.3f}, "
              f"range {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} pairs")
EOF
