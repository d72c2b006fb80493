#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, all in one run on one device (H100 or H200).
# Run from the repository root on the GPU machine; results go to $OUT (default /tmp/bench-gpu):
#   OUT=/tmp/bench-gpu bash bench/gpu_suite.sh
# Needs the project's Python dependencies importable (the device call adds carried wheels first).
# STAGES picks parts (default all: "8b hf 135m"), so a run can be split over two calls of one
# device lease that has a per-call time limit; the report reads whatever files are in $OUT.
set -u
OUT=${OUT:-/tmp/bench-gpu}
STAGES=${STAGES:-8b hf 135m}
has() { [[ " $STAGES " == *" $1 "* ]]; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M8=trtllm_gateway/config/models/llama-3.1-8b.json
M135=trtllm_gateway/config/models/smollm2-135m.json
TOK=${TOK:-.carry}  # a tokenizer.json directory for the 135M server
COMMON="--load-format dummy --max-model-len 2304 --max-num-tokens 8192 --input-len 1024 --output-len 1024"
{
  date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# 1 + 2: 8B batch-1 decode next to its roofline, then 512 x 1024/1024 offline.
has 8b && python3 -m bench.offline --model $M8 $COMMON --max-batch-size 384 --fit-batch --num-prompts 512 \
  --decode-latency --latency-output-len 256 > "$OUT/offline_8b.log" 2>&1
has 8b && tail -1 "$OUT/offline_8b.log" > "$OUT/offline_8b.json"
# 2b: HF transformers generate, same shape and lengths, one static batch.
has hf && python3 -m bench.hf_baseline --model $M8 --batch-sizes 128 64 > "$OUT/hf_8b.log" 2>&1
has hf && tail -1 "$OUT/hf_8b.log" > "$OUT/hf_8b.json"
# 3: 135M offline vs the same engine settings behind the HTTP server, concurrency 256.
has 135m && python3 -m bench.offline --model $M135 $COMMON --max-batch-size 256 --num-prompts 512 \
  --concurrency 256 > "$OUT/offline_135m.log" 2>&1
has 135m && tail -1 "$OUT/offline_135m.log" > "$OUT/offline_135m.json"
# The same engine settings behind the HTTP server: one token per chunk (the default), then
# --stream-interval 8 (a request's tokens go out every 8 steps; TensorRT-LLM's stream_interval).
for SI in $(has 135m && echo 1 8); do
  python3 -m trtllm_gateway serve --model $M135 --load-format dummy --tokenizer "$TOK" --port 8123 \
    --max-model-len 2304 --max-num-tokens 8192 --max-batch-size 256 --log-level warning \
    --stream-interval $SI > "$OUT/server_135m_si$SI.log" 2>&1 &
  SERVER=$!
  python3 -m bench.serve --base-url http://127.0.0.1:8123 --num-prompts 512 --input-len 1024 \
    --output-len 1024 --max-concurrency 256 --workers 8 > "$OUT/serve_135m_si$SI.json" \
    2>"$OUT/serve_135m_si$SI.err"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null
done
python3 -m bench.report_gpu "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
