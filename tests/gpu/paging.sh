#!/usr/bin/env bash
# GPU machine, after the CUDA variant is built (tests/gpu/backend_ops.sh, which also runs
# test-qsa-page's CUDA-vs-CPU checks of the paging ops): host-backed KV paging in the model
# graph on CUDA, every layer on the GPU: paged logits equal to unpaged bit for bit
# (tests/unit/test_paging.py, the same test CI runs on the CPU).
#   device run: carry [".gpu-carry"], command: tests/gpu/backend_ops.sh && tests/gpu/paging.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/pyqsa-gpu-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/pyqsa-site
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
models=$(echo .build/upstream/llama_cpp_python-*/vendor/llama.cpp/models)
mkdir -p "$models"
[ -f "$models/ggml-vocab-qwen35.gguf" ] || cp .gpu-carry/ggml-vocab-qwen35.gguf "$models/"
t0=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests/unit/test_paging.py > "$out/paging.log" 2>&1
status=$?
grep -E "passed|failed|Error|assert" "$out/paging.log" | tail -n 8
echo "paging on CUDA: $([ $status = 0 ] && echo PASS || echo FAIL) ($(( $(date +%s) - t0 )) s)"
exit $status
