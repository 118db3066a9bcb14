#!/usr/bin/env bash
# GPU machine, after the CUDA variant is built (tests/gpu/backend_ops.sh or bench/gpu_run.sh):
# (0) no library exports a copy of the C++ runtime; (1) the demo model with every layer on CUDA
# against the CPU backend, in one process, on the positional and sparse paths; (2) the HF parity
# tests with every layer on the GPU (HF itself runs on the CPU), with f32 products (the gate)
# and with upstream's TF32 ones (numbers only). Needs .gpu-carry and .gpu-carry-hf from
# tests/gpu/pack.sh (Qwen vocab; the pinned transformers wheel).
#   device run: carry [".gpu-carry", ".gpu-carry-hf"], command: tests/gpu/backend_ops.sh && tests/gpu/parity.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/pyqsa-gpu-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/pyqsa-site
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}  # one GPU: a 2-GPU machine would split the layers
models=$(echo .build/upstream/llama_cpp_python-*/vendor/llama.cpp/models)
mkdir -p "$models"
[ -f "$models/ggml-vocab-qwen35.gguf" ] || cp .gpu-carry/ggml-vocab-qwen35.gguf "$models/"
status=0
python3 -m pytest -q --tb=line -p no:cacheprovider tests/unit/test_build.py -k cpp_runtime 2>&1 | tail -n 4
[ "${PIPESTATUS[0]}" = 0 ] || status=1
t0=$(date +%s)
demo=$(python3 -c "from pyqsa.demo_model import demo_model_path; print(demo_model_path())")
PYQSA_CUDA_STRICT_F32=1 python3 tests/gpu/model_cuda_vs_cpu.py "$demo" 256 > "$out/model_cuda_vs_cpu.log" 2>&1 || status=1
grep -E "CUDA vs CPU|Error|error" "$out/model_cuda_vs_cpu.log" | tail -n 6
echo "demo model CUDA vs CPU: $([ $status = 0 ] && echo PASS || echo FAIL) ($(( $(date +%s) - t0 )) s)"
# HF's side is the pinned transformers (its wheel in .gpu-carry-hf, a carry of its own): another
# release's qwen4_exp is another reference
pin=$(sed -n 's/^transformers==//p' constraints.txt)
compgen -G ".gpu-carry-hf/transformers-$pin-*.whl" > /dev/null &&
    python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/pyqsa-site .gpu-carry-hf/transformers-"$pin"-*.whl
have=$(python3 -c "import transformers; print(transformers.__version__)" 2> /dev/null || echo none)
if [ "$have" != "$pin" ]; then
    echo "HF parity on CUDA: FAIL (transformers $have here, the pin is $pin: carry .gpu-carry-hf, tests/gpu/pack.sh)"
    exit 1
fi
# Upstream runs f32 matrix products in TF32 (cuBLAS math mode, ggml's f32 mma kernels), about
# 1e-3 relative error each. The gate: the tests with those products held to f32
# (PYQSA_CUDA_STRICT_F32, ggml_patches/0008), at the CPU's tolerance. Then the same tests at
# upstream's precision, for the numbers users get (their tolerances are the CPU's: not a gate).
t0=$(date +%s)
PYQSA_CUDA_STRICT_F32=1 PYQSA_TEST_N_GPU_LAYERS=999 python3 -m pytest -q -p no:cacheprovider \
    tests/parity ${PYQSA_PARITY_ARGS:-} > "$out/parity-strict-f32.log" 2>&1 || status=1
grep -E "parity|passed|failed|error" "$out/parity-strict-f32.log" | tail -n 24
echo "HF parity on CUDA, f32 products: $(( $(date +%s) - t0 )) s"
PYQSA_TEST_N_GPU_LAYERS=999 python3 -m pytest -q -p no:cacheprovider tests/parity \
    ${PYQSA_PARITY_ARGS:-} > "$out/parity-tf32.log" 2>&1
echo "HF parity on CUDA, upstream's TF32 products (numbers only):"
sed -n '/parity vs HF/,/short test summary/p' "$out/parity-tf32.log" | sed '1d;$d'
exit $status
