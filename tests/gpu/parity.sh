#!/usr/bin/env bash
# GPU machine, after tests/gpu/backend_ops.sh built the CUDA variant: the HF parity tests with
# every layer on the GPU (HF itself runs on the CPU). Needs transformers in .gpu-carry.
#   device run: carry [".gpu-carry"], command: tests/gpu/backend_ops.sh && tests/gpu/parity.sh
# (tests/gpu/pack.sh leaves the Qwen vocab GGUF out; bench/pack.sh adds it)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/pyqsa-gpu-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/pyqsa-site PYQSA_TEST_N_GPU_LAYERS=999
python3 -m pytest -q -p no:cacheprovider tests/parity ${PYQSA_PARITY_ARGS:-} 2>&1 | tee "$out/parity.log"
