#!/usr/bin/env bash
# One device call: install carried wheels, GPU tests, then the GPU benchmarks. Logs under $OUT.
# Usage (on the device): bash bench/gpu_call.sh [tests] [suite] [disagg] [hoststep] [pieces]
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
      # the guided tests decode with SmolLM2's tokenizer: the carried one
      GUIDED_TOKENIZER_DIR=${GUIDED_TOKENIZER_DIR:-${TOK:-.whl/tok}} \
        timeout 400 python3 -m pytest tests/gpu -q -x -o filterwarnings=ignore -p no:cacheprovider \
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
    *) echo "unknown step $what" ;;
  esac
done
