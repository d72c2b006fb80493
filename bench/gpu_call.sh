#!/usr/bin/env bash
# One device call: install carried wheels, GPU tests, then the GPU benchmarks. Logs under $OUT.
# Usage (on the device): bash bench/gpu_call.sh [tests] [suite] [disagg] [hoststep] [pieces]
#   [attn] [offline8]
#   suite: bench/gpu_suite.sh (its STAGES, NUM8, B8, NUM135, MODES135 pass through) under a
#   SUITE_TIMEOUT (default 540 s), its files packed into $OUT/bench-gpu.tgz (the device tool
#   returns at most 8 files) beside summary.md; the tokenizer comes from .whl/tok; PYSPY= (empty)
#   turns the py-spy sampling off.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:. TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cuda', torch.version.cuda)"
  python3 -V
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
for what in "$@"; do
  case "$what" in
    tests)
      # the guided tests decode with SmolLM2's tokenizer: the carried one. The whole of tests/gpu
      # took ~420 s on fresh H200 hosts (2026-11-29, in two calls): it fills one call by itself.
      GUIDED_TOKENIZER_DIR=${GUIDED_TOKENIZER_DIR:-${TOK:-.whl/tok}} \
        timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest tests/gpu -q -x -o filterwarnings=ignore -p no:cacheprovider \
        > "$OUT/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"; tail -5 "$OUT/gpu_tests.log" ;;
    suite)
      OUT=/tmp/bench-gpu TOK=${TOK:-.whl/tok} PYSPY=${PYSPY-/tmp/site/bin/py-spy} \
        timeout "${SUITE_TIMEOUT:-540}" bash bench/gpu_suite.sh 2>&1 | tee "$OUT/suite.log"
      cp /tmp/bench-gpu/summary.md "$OUT/" 2>/dev/null
      tar czf "$OUT/bench-gpu.tgz" -C /tmp bench-gpu ;;
    disagg)
      # Issue 41's comparison on a 2-GPU host: aggregated on GPU 0, prefill 0 + decode 1, two
      # aggregated round robin; DISAGG_SETUPS splits it over calls (default agg,pd,agg2).
      timeout "${DISAGG_TIMEOUT:-570}" python3 -m bench.disagg --preset gpu-8b \
        --tokenizer "${TOK:-.whl/tok}" --setups "${DISAGG_SETUPS:-agg,pd,agg2}" \
        --log-dir /tmp/disagg-logs --out "$OUT/disagg.json" > "$OUT/disagg.log" 2>&1
      echo "disagg rc=$?"; tail -8 "$OUT/disagg.log"
      tar czf "$OUT/disagg-logs.tgz" -C /tmp disagg-logs ;;
    hoststep)
      # The core's host time a step (bench/host_step.py, a one-layer model on the GPU) for this
      # tree and, when carried, the base tree (BASE, default .basetree), rounds interleaved.
      BASE=${BASE:-.basetree}
      [[ -d "$BASE/bench" ]] && cp bench/host_step.py "$BASE/bench/"
      for r in $(seq "${HOST_ROUNDS:-3}"); do
        for tree in "$BASE" .; do
          [[ -d "$tree/trtllm_gateway" ]] || continue
          (cd "$tree" && timeout 200 python3 -m bench.host_step --device cuda \
            --tokenizer "$OLDPWD/.whl/tok" --running "${RUNNING:-256}") 2>> "$OUT/host_step.err" \
            | sed "s|^|$tree round $r: |" | tee -a "$OUT/host_step.txt"
        done
      done ;;
    pieces)
      # The piecewise graphs' gate (branch piecewise-graphs): their GPU tests and the greedy
      # equivalence, then the served A/B against the carried base tree (main without them).
      GUIDED_TOKENIZER_DIR=${TOK:-.whl/tok} timeout 300 python3 -m pytest -q -x \
        -o filterwarnings=ignore -p no:cacheprovider tests/gpu/test_piecewise_graph.py \
        tests/gpu/test_greedy_equivalence.py tests/gpu/test_step_path.py \
        > "$OUT/pieces_tests.log" 2>&1; echo "pieces tests rc=$?"; tail -5 "$OUT/pieces_tests.log"
      BASE=${BASE:-.basetree} ROUNDS=${ROUNDS:-1} NUM=${NUM:-768} API_SERVERS=auto \
        timeout 300 bash bench/ab_serve.sh 2>&1 | tail -6
      grep -h "piecewise graphs" "$OUT"/ab/server_*.log | head -2 ;;
    attn)
      # Decode attention over an e4m3 cache: the kernel tests, then bench.attn_variants at the
      # 8B shape (batch 256 and 32) and the 135M shape, WORDS configs of the 16-bit-word kernel
      # beside the engine's byte-typed kernel at its tiles.
      timeout 300 python3 -m pytest -q -x -o filterwarnings=ignore -p no:cacheprovider \
        tests/gpu/test_kernels.py tests/gpu/test_fp8.py -k "decode" > "$OUT/attn_tests.log" 2>&1
      echo "attn tests rc=$?"; tail -3 "$OUT/attn_tests.log"
      W=${WORDS:-"64,2,5 64,2,3 64,4,3 128,4,3 32,2,4 128,2,4 64,4,4 32,4,3 128,8,3"}
      for shape in "--batch 256 --ctx 1536" "--batch 32 --ctx 1536" \
        "--batch 256 --ctx 1632 --heads 9 --kv-heads 3 --head-dim 64"; do
        # shellcheck disable=SC2086
        timeout 200 python3 -m bench.attn_variants $shape --splits 1 --configs "64,2,5 64,4,3" \
          --words-configs "$W" --rounds "${ATTN_ROUNDS:-3}" 2>> "$OUT/attn.err" | tee -a "$OUT/attn.json" \
          | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['shape']['batch'], d['shape']['head_dim'], d['copy_TBps']); [print(' ', v['variant'], round(v.get('ms', 0), 4), round(v.get('of_copy_bw', 0), 3), v.get('rel_err', v.get('error'))) for v in d['variants']]"
      done ;;
    offline8)
      # 8B FP8 weights + KV offline at 1,024 / 1,024 (issue 39's figure), this tree and the carried
      # base tree (BASE, default .basetree) in turns.
      BASE=${BASE:-.basetree}
      for r in $(seq "${OFF_ROUNDS:-1}"); do
        for tree in "$BASE" .; do
          [[ -d "$tree/trtllm_gateway" ]] || continue
          (cd "$tree" && timeout 280 python3 -m bench.offline --model \
            trtllm_gateway/config/models/llama-3.1-8b.json --load-format dummy \
            --tokenizer "$OLDPWD/.whl/tok" --max-model-len 2304 --max-num-tokens 8192 \
            --quantization fp8 --kv-cache-dtype fp8 --max-batch-size 512 --fit-batch \
            --num-prompts "${NUM8:-512}" --input-len 1024 --output-len 1024 --concurrency 256) \
            2>> "$OUT/offline8.err" | tail -1 | sed "s|^|$tree round $r: |" | tee -a "$OUT/offline8.txt"
        done
      done ;;
    *) echo "unknown step $what" ;;
  esac
done
