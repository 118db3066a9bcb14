#!/usr/bin/env bash
# GPU machine, after the CUDA variant is built (tests/gpu/backend_ops.sh or bench/gpu_run.sh):
# CI's own CPU tests of the model graph, run on the CUDA build with every layer on the GPU.
#   tests/gpu/cuda_pytest.sh LABEL TEST_FILE...   (prints "LABEL on CUDA: PASS|FAIL", log in $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
label=$1
shift
out=${OUT:-/tmp/pyqsa-gpu-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/pyqsa-site
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
models=$(echo .build/upstream/llama_cpp_python-*/vendor/llama.cpp/models)
mkdir -p "$models"
[ -f "$models/ggml-vocab-qwen35.gguf" ] || cp .gpu-carry/ggml-vocab-qwen35.gguf "$models/"
t0=$(date +%s)
python3 -m pytest -q -p no:cacheprovider "$@" > "$out/$label.log" 2>&1
status=$?
grep -E "passed|failed|Error|assert" "$out/$label.log" | tail -n 8
echo "$label on CUDA: $([ $status = 0 ] && echo PASS || echo FAIL) ($(( $(date +%s) - t0 )) s)"
exit $status
