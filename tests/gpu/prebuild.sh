#!/usr/bin/env bash
# Run HERE (no GPU needed) before a device run: build pyqsa's CUDA variant (sm_90a) of this tree
# and pack it into .gpu-carry/prebuilt-cuda.tar.xz plus its stamp, so that bench/gpu_run.sh and
# tests/gpu/backend_ops.sh unpack it (tests/gpu/prebuilt.sh) instead of spending ~325 s of device
# time on the build. They build as before when the stamp's inputs differ from the tree they run
# or the prebuilt fails to load there.
#   tests/gpu/prebuild.sh        PREBUILD_JOBS (default 2, under nice), CUDA_HOME (nvcc 13,
#                                default /usr/local/cuda-13.0)
# The tree built is the one a device run carries (tracked and untracked files, not ignored),
# copied to .build/prebuild-cuda/src, which has a .build of its own: the main checkout's
# .build/cmake-*, .build/llama.cpp and .build/py are not touched. Rebuilds are incremental.
# First run: 29 min at -j2 on the 2-core development machine (the CUDA objects; 50-60 with a test
# run or the CPU variant's pip build beside it); after a change to native/ minutes (the changed
# objects, the links); downloads the cuBLAS wheel once (423 MB). The archive: 15.7 MB (libggml-cuda
# 160 MB unpacked). Then upstream's library for the comparisons, once per pin
# (.gpu-carry-upstream/upstream-cuda.tar.xz, a carry of its own: a call that runs upstream carries it); with PREBUILD_QUANTIZE=1 upstream's llama-quantize
# (.gpu-carry/llama-quantize, for bench/quant_run.sh; 7 min at -j2).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/prebuilt.sh
cuda=${CUDA_HOME:-/usr/local/cuda-13.0}
work=.build/prebuild-cuda
src=$work/src
kit=$PWD/$work/cuda
mkdir -p "$src/.build/upstream" "$kit" .gpu-carry .gpu-carry-upstream
t0=$(date +%s)

# the verified upstream extract (as pack.sh makes it), linked into the snapshot's .build
extract=$(python3 -c "import sys; sys.path.insert(0, '.'); from pyqsa._build import upstream as u; print(u.fetch())")
ln -sfn "$extract" "$src/.build/upstream/$(basename "$extract")"

# cuBLAS: nvcc's toolkit here has none. The wheel that torch 2.11+cu130 pins (the GPU image's
# cuBLAS; any 13.x has the SONAME libcublas.so.13 the libraries will name)
cublas=$kit/nvidia/cu13
if [ ! -f "$cublas/lib/libcublas.so.13" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_27_x86_64 -d "$kit" nvidia-cublas==13.1.0.3
    python3 -m zipfile -e "$kit"/nvidia_cublas-*.whl "$kit"
    rm -f "$kit"/nvidia_cublas-*.whl "$cublas/lib/libnvblas.so.13"
fi
# libcuda.so.1, the driver (ggml's VMM pool calls it): a stand-in with every cu* entry point of
# cuda.h, only to satisfy the link; the GPU machine's driver is the real one. Never packed.
if [ ! -f "$kit/stub/libcuda.so.1" ]; then
    mkdir -p "$kit/stub"
    gcc -E -I"$cuda/include" "$cuda/include/cuda.h" | grep -oE '\bcu[A-Z][A-Za-z0-9_]*\s*\(' |
        sed 's/\s*($//' | sort -u | sed 's/.*/int &(void) { return 999; }/' > "$kit/stub/libcuda.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$kit/stub/libcuda.so.1" "$kit/stub/libcuda.c"
    ln -sf libcuda.so.1 "$kit/stub/libcuda.so"
fi

# the snapshot: the build's inputs as a device run would carry them. A file takes a fresh time
# there only when its content differs from the last snapshot's, so ninja rebuilds what changed
# whatever the file's own time: one edited while the last build ran is older than the objects
# built from its old content. Files gone from the tree go from the snapshot.
next=$work/next
rm -rf "$next" && mkdir -p "$next"
git ls-files -co --exclude-standard -z -- native ggml_patches pyqsa/_build pyqsa/__init__.py \
    UPSTREAM setup.py | tar --null --ignore-failed-read -T - -cf - 2> /dev/null | tar -C "$next" -xf -
(cd "$next" && find . -type f) | while read -r f; do
    cmp -s "$next/$f" "$src/$f" || { mkdir -p "$(dirname "$src/$f")" && cp "$next/$f" "$src/$f"; }
done
(cd "$src" && find native ggml_patches pyqsa UPSTREAM setup.py -type f 2> /dev/null) | while read -r f; do
    [ -e "$next/$f" ] || rm -f "$src/$f"
done
rm -rf "$next"
inputs=$(prebuilt_inputs "$src")

# The carry's room (64 MiB in all, .gpu-carry ~32 MiB already) sets two choices. 90a-real: the
# sm_90a machine code without the compute_90a PTX that 90a also embeds (68% of the raw fatbin; an
# arch-specific PTX is of no use on any GPU but the sm_90a it came with, which runs the machine
# code). Fatbin compression none (GGML_CUDA_COMPRESSION_MODE, upstream's default: size): xz packs
# the raw code ~18% smaller than nvcc's compression does. The kernels are those a 90a build has.
# GGML_NATIVE=OFF: the CPU backend for x86-64-v3 (AVX2, FMA, F16C, BMI2), not -march=native of
# this CPU, which the GPU machine's may not share. cuBLAS headers and libraries from the wheel
# (-rpath-link: executables linked against libggml need what libggml-cuda needs, libcublas.so.13
# needs libcublasLt.so.13), the stand-in driver.
export PYQSA_CUDA=1 PYQSA_CUDA_ARCHS=90a-real PYQSA_BUILD_JOBS=${PREBUILD_JOBS:-2}
export PYQSA_EXTRA_TARGETS=test-backend-ops CUDACXX=$cuda/bin/nvcc
kit_args="-DGGML_NATIVE=OFF -DGGML_CUDA_COMPRESSION_MODE=none -DCUDAToolkit_ROOT=$cuda
    -DCUDA_cublas_LIBRARY=$cublas/lib/libcublas.so.13 -DCUDA_cublasLt_LIBRARY=$cublas/lib/libcublasLt.so.13
    -DCUDA_cuda_driver_LIBRARY=$kit/stub/libcuda.so -DCMAKE_CUDA_FLAGS=-I$cublas/include"
rpath_link=-Wl,-rpath-link,$cublas/lib:$kit/stub
export PYQSA_CMAKE_ARGS="$kit_args -DCMAKE_EXE_LINKER_FLAGS=$rpath_link
    -DCMAKE_SHARED_LINKER_FLAGS=$rpath_link"
echo "building the CUDA variant of inputs $inputs in $src (log: $work/build.log)"
(cd "$src" && nice -n 15 python3 -c 'from pyqsa._build import native; native.build()') \
    > "$work/build.log" 2>&1 || { tail -n 30 "$work/build.log"; exit 1; }
echo "built ($(( $(date +%s) - t0 )) s)"

# the archive: bin/ of the build folder (the libraries, by their SONAME files and links, and
# the test binaries, which find the libraries through RUNPATH $ORIGIN); pip's editable install
# there stages the libraries into .build/py as a build would
bin=$src/.build/cmake-cuda/bin
(cd "$bin/.." && tar -cf - bin/lib*.so* bin/test-{qsa-ops,qsa-page,sample,products,gdn,fused,input-stage,backend-ops}) |
    xz -9 -T2 > .gpu-carry/prebuilt-cuda.tar.xz.tmp
mv .gpu-carry/prebuilt-cuda.tar.xz.tmp .gpu-carry/prebuilt-cuda.tar.xz
dirty=$(git diff --quiet HEAD -- native ggml_patches pyqsa setup.py UPSTREAM || echo " plus changes")
{
    echo "inputs=$inputs archs=90a"  # what it stands in for (PYQSA_CUDA_ARCHS there)
    echo "targets=$PYQSA_EXTRA_TARGETS"
    echo "built=$(date -u +%FT%TZ) from $(git rev-parse --short HEAD)$dirty, archs $PYQSA_CUDA_ARCHS, $("$cuda/bin/nvcc" --version |
        sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\)/nvcc \2/p'), $(gcc -dumpfullversion) on $(. /etc/os-release; echo "$ID $VERSION_ID")"
} > .gpu-carry/prebuilt-cuda.stamp
[ "$(prebuilt_inputs .)" = "$inputs" ] ||
    echo "NOTE: the tree changed while it built; the stamp holds the snapshot's inputs ($inputs)"
cat .gpu-carry/prebuilt-cuda.stamp
du -h .gpu-carry/prebuilt-cuda.tar.xz

# upstream's unpatched library for the comparisons (bench/gpu_run.sh's upstream variant), built
# again only when the pin changes; PREBUILD_UPSTREAM=0 skips it. The same kit and choices as
# above, upstream's flags as the GPU machine's build has them (upstream_configure).
pin="upstream=$(sed -n 's/^llama_cpp_commit *= *//p' UPSTREAM) archs=90a"
if [ "${PREBUILD_UPSTREAM:-1}" = 1 ] && { [ ! -f .gpu-carry-upstream/upstream-cuda.tar.xz ] ||
    [ "$(grep -E '^upstream=' .gpu-carry-upstream/upstream-cuda.stamp 2> /dev/null)" != "$pin" ]; }; then
    up=$work/upstream-cuda
    echo "building upstream's CUDA library ($pin) in $up (log: $work/build-upstream.log)"
    # shellcheck disable=SC2086 # kit_args: one cmake argument per word
    (upstream_configure "$extract/vendor/llama.cpp" "$up" 90a-real "$rpath_link" $kit_args \
        -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" &&
        nice -n 15 cmake --build "$up" -j "${PREBUILD_JOBS:-2}" --target llama) \
        > "$work/build-upstream.log" 2>&1 || { tail -n 30 "$work/build-upstream.log"; exit 1; }
    (cd "$up" && tar -cf - bin/lib*.so*) | xz -9 -T2 > .gpu-carry-upstream/upstream-cuda.tar.xz.tmp
    mv .gpu-carry-upstream/upstream-cuda.tar.xz.tmp .gpu-carry-upstream/upstream-cuda.tar.xz
    {
        echo "$pin"
        echo "built=$(date -u +%FT%TZ), archs 90a-real, $("$cuda/bin/nvcc" --version |
            sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\)/nvcc \2/p')"
    } > .gpu-carry-upstream/upstream-cuda.stamp
    echo "built upstream ($(( $(date +%s) - t0 )) s)"
fi
[ -f .gpu-carry-upstream/upstream-cuda.stamp ] && cat .gpu-carry-upstream/upstream-cuda.stamp

# upstream's llama-quantize for bench/quant_run.sh (no build on the GPU machine), only when asked:
# PREBUILD_QUANTIZE=1 (6 MB stripped: with every other file of .gpu-carry it passes the 64 MiB
# limit with .gpu-carry-upstream or .gpu-carry-hf: a quant_run.sh call carries neither).
# CPU only, static, x86-64-v3 (GGML_NATIVE=OFF), built again when the pin changes.
if [ "${PREBUILD_QUANTIZE:-0}" = 1 ] &&
    [ "$(head -n 1 .gpu-carry/llama-quantize.stamp 2> /dev/null)" != "$(quantize_pin)" ]; then
    echo "building upstream's llama-quantize in $work/upstream-quantize (log: $work/build-quantize.log)"
    (renice -n 15 -p "$BASHPID" > /dev/null &&
        quantize_build "$extract/vendor/llama.cpp" "$work/upstream-quantize" "${PREBUILD_JOBS:-2}" -DGGML_NATIVE=OFF) \
        > "$work/build-quantize.log" 2>&1 || { tail -n 30 "$work/build-quantize.log"; exit 1; }
    strip -o .gpu-carry/llama-quantize "$work/upstream-quantize/bin/llama-quantize"
    { quantize_pin; echo "built=$(date -u +%FT%TZ), CPU only, GGML_NATIVE=OFF"; } > .gpu-carry/llama-quantize.stamp
fi
carry_room
