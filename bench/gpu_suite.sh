#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, all in one run on one device (H100 or H200).
# Run from the repository root on the GPU machine; results go to $OUT (default /tmp/bench-gpu):
#   OUT=/tmp/bench-gpu bash bench/gpu_suite.sh
# Needs the project's Python dependencies importable (the device call adds carried wheels first).
# STAGES picks parts (default all: "8b 8bfp8 hf 135m"; 8bfp8 is 8b with --quantization fp8
# --kv-cache-dtype fp8), so a run can be split over two calls of one
# device lease that has a per-call time limit; the report reads whatever files are in $OUT.
# Each HTTP-vs-offline ratio uses one prompt set (bench.offline and bench.serve draw the same
# random ids from --seed 0), the same lengths, concurrency and engine settings on both sides.
set -u
OUT=${OUT:-/tmp/bench-gpu}
STAGES=${STAGES:-8b 8bfp8 hf 135m}
NUM8=${NUM8:-512}           # 8B requests, offline and over HTTP
B8=${B8:-384}               # 8B --max-batch-size; offline --fit-batch caps it to what the KV holds
NUM135=${NUM135:-512}       # 135M requests, offline and over HTTP
LEN=${LEN:-1024}            # input and output tokens a request (smaller only for a dry run)
MODES135=${MODES135:-process thread}  # 135M one-token-per-chunk runs: --[no-]engine-process
SMALLTOK8=${SMALLTOK8:-}    # non-empty: also serve 8B with $TOK as is (ids past it stream nothing)
PYSPY=${PYSPY:-}            # a py-spy binary: sample gateway and core in the 135M si=1 process run
API_SERVERS=${API_SERVERS:-}  # N > 1: also serve 135M si=1 with --api-server-count N (+ py-spy)
CONC=256
FP8=""        # the fp8 stage sets it: engine flags every server and offline run of that stage gets
has() { [[ " $STAGES " == *" $1 "* ]]; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M8=${M8:-trtllm_gateway/config/models/llama-3.1-8b.json}  # other shapes only for a dry run
M135=${M135:-trtllm_gateway/config/models/smollm2-135m.json}
TOK=${TOK:-.carry}  # a tokenizer.json directory for the servers
ENGINE="--load-format dummy --max-model-len 2304 --max-num-tokens 8192"
COMMON="$ENGINE --input-len $LEN --output-len $LEN"
PORT=8123
URL=http://127.0.0.1:$PORT
{
  date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  echo "cpus $(nproc)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# serve NAME MODEL MAX_BATCH STREAM_INTERVAL ENGINE_FLAG NUM [PROFILE]: one server (tokenizer
# $SERVE_TOK, default $TOK), one bench.serve
# run against it with bench.proc_sample recording CPU and the running gauge once a second;
# PROFILE=1 also records 10 s of py-spy stacks of the gateway and the core mid-run. SERVE_FLAGS:
# more serve flags (--api-server-count N: the serve process supervises the core and N servers,
# and the first API server is the "gateway" py-spy samples).
serve() {
  local name=$1 model=$2 mb=$3 si=$4 flag=$5 num=$6 profile=${7:-}
  echo "$(date -u +%T) serve $name"
  python3 -m trtllm_gateway serve --model "$model" $ENGINE --tokenizer "${SERVE_TOK:-$TOK}" \
    --port $PORT --max-batch-size "$mb" --stream-interval "$si" "$flag" ${SERVE_FLAGS:-} $FP8 \
    --log-level warning \
    > "$OUT/server_$name.log" 2>&1 &
  local server=$!
  python3 -c "from bench.serve import wait_ready; wait_ready('$URL', 300)" || {
    echo "server $name did not start"; kill "$server"; wait "$server"; return 1; }
  timeout 300 python3 -m bench.serve --base-url $URL --num-prompts "$num" --input-len "$LEN" \
    --output-len "$LEN" --max-concurrency $CONC --workers 8 > "$OUT/serve_$name.json" \
    2> "$OUT/serve_$name.err" &
  local client=$!
  python3 -m bench.proc_sample --pid "$server" --client-pid "$client" \
    --metrics-url $URL/metrics > "$OUT/samples_$name.jsonl" 2> "$OUT/samples_$name.err" &
  local sampler=$!
  if [[ -n "$profile" && -n "$PYSPY" ]]; then
    sleep 12
    local core gateway
    core=$(pgrep -P "$server" -f trtllm_gateway.engine.transport.process | head -1)
    gateway=$(pgrep -P "$server" -f trtllm_gateway.app.api_server | head -1)
    "$PYSPY" record --pid "${gateway:-$server}" --duration 10 --rate 100 --nonblocking --format raw \
      -o "$OUT/spy_gateway_$name.txt" > "$OUT/spy_gateway_$name.log" 2>&1 &
    [[ -n "$core" ]] && "$PYSPY" record --pid "$core" --duration 10 --rate 100 --nonblocking \
      --format raw -o "$OUT/spy_core_$name.txt" > "$OUT/spy_core_$name.log" 2>&1 &
  fi
  wait "$client"
  local kids
  kids=$(pgrep -P "$server")
  kill "$sampler" "$server"; wait "$sampler" "$server" 2>/dev/null
  for _ in $(seq 60); do  # the next server sizes its KV cache from free GPU memory
    [[ -z "$kids" ]] || ! kill -0 $kids 2>/dev/null && break
    sleep 0.5
  done
  echo "$(date -u +%T) done $name: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(round(r['output_throughput']), 'tok/s', r['completed'], 'ok', r['failed'], 'failed')" "$OUT/serve_$name.json" 2>&1 | tail -1)"
}

# 3: 135M offline vs the same engine settings behind the HTTP server, concurrency 256, first
# (the issue's main target): one token per chunk in both engine modes, then --stream-interval 8
# (a request's tokens go out every 8 steps; TensorRT-LLM's stream_interval), engine process.
if has 135m; then
  echo "$(date -u +%T) offline 135m"
  timeout 300 python3 -m bench.offline --model $M135 $COMMON --max-batch-size $CONC \
    --num-prompts "$NUM135" --concurrency $CONC > "$OUT/offline_135m.log" 2>&1
  tail -1 "$OUT/offline_135m.log" > "$OUT/offline_135m.json"
  for mode in $MODES135; do
    if [[ $mode == process ]]; then
      serve 135m_si1 $M135 $CONC 1 --engine-process "$NUM135" profile
    else
      serve 135m_si1_thread $M135 $CONC 1 --no-engine-process "$NUM135"
    fi
  done
  if [[ -n "$API_SERVERS" ]]; then
    SERVE_FLAGS="--api-server-count $API_SERVERS" \
      serve "135m_si1_api$API_SERVERS" $M135 $CONC 1 --engine-process "$NUM135" profile
  fi
  serve 135m_si8 $M135 $CONC 8 --engine-process "$NUM135"
fi
# 1 + 2: 8B batch-1 decode next to its roofline, then NUM8 x 1024/1024 at concurrency 256 offline,
# then the same over HTTP with one token per chunk (engine process), at the batch offline fitted.
FP8=""
# The 8B shape samples ids past $TOK's vocabulary, which would decode to nothing and stream
# no chunk; the padded copy makes every token a chunk, as a real Llama-3 tokenizer would.
if has 8b || has 8bfp8; then
  python3 -m bench.vocab_pad "$TOK" /tmp/tok-8b \
    "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" $M8)"
fi
for stage in 8b 8bfp8; do
  has $stage || continue
  FP8=""
  [[ $stage == 8bfp8 ]] && FP8="--quantization fp8 --kv-cache-dtype fp8"
  echo "$(date -u +%T) offline $stage"
  timeout 400 python3 -m bench.offline --model $M8 $COMMON --max-batch-size "$B8" --fit-batch \
    --num-prompts "$NUM8" --concurrency $CONC --decode-latency --latency-output-len 256 $FP8 \
    > "$OUT/offline_$stage.log" 2>&1
  tail -1 "$OUT/offline_$stage.log" > "$OUT/offline_$stage.json"
  fit=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_running'])" \
    "$OUT/offline_$stage.json" 2>/dev/null || echo "$B8")
  [[ -n "${SERVE8:-1}" ]] && SERVE_TOK=/tmp/tok-8b serve ${stage}_si1 $M8 "$fit" 1 --engine-process "$NUM8"
  [[ -n "${SMALLTOK8:-}" ]] && serve ${stage}_si1_smalltok $M8 "$fit" 1 --engine-process "$NUM8"
done
FP8=""
# 2b: HF transformers generate, same shape and lengths, one static batch.
has hf && python3 -m bench.hf_baseline --model $M8 --batch-sizes 128 64 > "$OUT/hf_8b.log" 2>&1
has hf && tail -1 "$OUT/hf_8b.log" > "$OUT/hf_8b.json"
python3 -m bench.report_gpu "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
