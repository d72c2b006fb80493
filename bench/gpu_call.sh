#!/usr/bin/env bash
# One device call: install carried wheels, GPU tests, then the GPU benchmarks. Logs under $OUT.
# Usage (on the device): bash bench/gpu_call.sh [tests] [bench] [serve] [hf]
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
      timeout 400 python3 -m pytest tests/gpu -q -x -o filterwarnings=ignore -p no:cacheprovider \
        > "$OUT/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"; tail -5 "$OUT/gpu_tests.log" ;;
    *) echo "unknown step $what" ;;
  esac
done
