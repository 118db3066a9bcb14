#!/usr/bin/env bash
# GPU machine: build the CUDA variant through the normal setup path and run upstream's
# test-backend-ops for the ops QSA models rely on. Needs .gpu-carry/ from tests/gpu/pack.sh (and,
# to skip the build, tests/gpu/prebuild.sh's prebuilt-cuda.tar.xz).
#   device run: carry [".gpu-carry"], command: tests/gpu/backend_ops.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/pyqsa-gpu-out}
rm -rf .build/upstream .build/llama.cpp  # a warm machine keeps ignored outputs of the last run
mkdir -p "$out" .build/upstream
exec > >(tee "$out/backend_ops.log") 2>&1
tar -C .build/upstream -xzf .gpu-carry/upstream-extract.tar.gz
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/pyqsa-site .gpu-carry/*.whl
export PYTHONPATH=/tmp/pyqsa-site
# PYQSA_SKIP_UPSTREAM_OPS=1 skips upstream's own op tests (they do not change with our code)
skip_upstream=${PYQSA_SKIP_UPSTREAM_OPS:-0}
export PYQSA_CUDA=1 PYQSA_BUILD_JOBS=$(nproc)
export PYQSA_EXTRA_TARGETS=$([ "$skip_upstream" = 1 ] || echo test-backend-ops)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t0=$(date +%s)
# the carried build of tests/gpu/prebuild.sh when it is this tree's and runs here, else a build
. tests/gpu/prebuilt.sh
if prebuilt_install; then
    echo "build: none, the carried prebuilt in place in $(( $(date +%s) - t0 )) s"
else
    python3 -m pip install -q --no-build-isolation --no-deps --no-index -e .
    echo "build: $(( $(date +%s) - t0 )) s (CUDA variant, archs ${PYQSA_CUDA_ARCHS:-90a})"
fi
python3 -m pyqsa.cli info
bin=.build/cmake-cuda/bin/test-backend-ops
status=0
for op in $([ "$skip_upstream" = 1 ] || echo TOP_K FLASH_ATTN_EXT GATED_DELTA_NET SSM_CONV); do
    t0=$(date +%s)
    if "$bin" test -o "$op" -b CUDA0 > "$out/test-$op.log" 2>&1; then r=PASS; else r=FAIL; status=1; fi
    echo "$op: $r ($(grep -c 'OK' "$out/test-$op.log") cases OK, $(grep -c 'FAIL' "$out/test-$op.log") FAIL lines, $(( $(date +%s) - t0 )) s)"
    tail -n 3 "$out/test-$op.log"
done
# pyqsa's op checks: CUDA against CPU, then their timings (on the GPU only: the shapes take
# minutes on the CPU backend)
op_check() {  # binary, label
    if ".build/cmake-cuda/bin/$1" test -b CUDA0 > "$out/$1.log" 2>&1; then r=PASS; else r=FAIL; status=1; fi
    echo "$2: $r ($(tail -n 1 "$out/$1.log"))"
    grep -E "FAIL" "$out/$1.log" | head -n 20 || true
    ".build/cmake-cuda/bin/$1" perf -b CUDA0 2>&1 | tee "$out/perf-$1.log"
}
op_check test-qsa-ops "pyqsa ops"
op_check test-qsa-page "pyqsa paging op"
op_check test-sample "pyqsa sample op"
op_check test-products "matrix products (pyqsa's CUDA dispatch and precision)"
op_check test-gdn "gated delta rule (pyqsa's prefill kernel)"
op_check test-fused "qwen4exp's fused ops against upstream's"
op_check test-input-stage "the scheduler's input stage (patch 0028)"
exit $status
