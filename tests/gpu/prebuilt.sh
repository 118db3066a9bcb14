# Sourced (bash). The CUDA variant built ahead (tests/gpu/prebuild.sh, on the development machine)
# and carried in .gpu-carry/prebuilt-cuda.tar.xz, so a device run need not spend ~325 s building.
#   prebuilt_inputs DIR   digest of what decides the build, the same on both machines
#   prebuilt_install      GPU machine: unpack where the setup path puts its outputs, install
#                         editable, check it loads and runs; status 0, else the caller builds

# What the CUDA build depends on: native/ (less the dev corner's standalone studies, which no
# build target compiles, and its Markdown), the patches, the build code, the version compiled in
# (pyqsa/__init__.py), setup.py and the pin (UPSTREAM holds the sdist's sha256, so it stands for
# the extract). File contents, not git: the GPU machine's tree is the working tree sent, its .git
# is not that tree.
prebuilt_inputs() {
    (cd "$1" && find native ggml_patches pyqsa/_build pyqsa/__init__.py UPSTREAM setup.py \
        -path native/dev -prune -o -name __pycache__ -prune -o -name '*.md' -prune -o -type f -print |
        LC_ALL=C sort | xargs -d '\n' sha256sum | sha256sum | cut -c1-16)
}

# unpack_xz TARBALL DIR: a .tar.xz into DIR (Python's tarfile where the image's tar has no xz)
unpack_xz() {
    tar -C "$2" -xJf "$1" 2> /dev/null ||
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"
}

prebuilt_install() {
    local tarball=.gpu-carry/prebuilt-cuda.tar.xz stamp=.gpu-carry/prebuilt-cuda.stamp
    local bin=.build/cmake-cuda/bin want have unpacked t
    # bin/.prebuilt names the prebuilt unpacked there; taken away first, so a build of another
    # tree that follows (a fallback, or the next call's) does not pass for it later
    unpacked=$(cat "$bin/.prebuilt" 2> /dev/null) && rm -f "$bin/.prebuilt"
    [ "${PYQSA_PREBUILT_USE:-1}" = 1 ] && [ -f "$tarball" ] && [ -f "$stamp" ] || return 1
    want="inputs=$(prebuilt_inputs .) archs=${PYQSA_CUDA_ARCHS:-90a}"
    have=$(grep -E '^inputs=' "$stamp")
    if [ "$have" != "$want" ]; then
        echo "prebuilt: not for this tree (carried: $have; here: $want), building"
        return 1
    fi
    for t in ${PYQSA_EXTRA_TARGETS:-}; do
        grep -qE "^targets=.*\b$t\b" "$stamp" || { echo "prebuilt: has no $t, building"; return 1; }
    done
    if [ "$unpacked" != "$have" ]; then  # (a warm machine may hold it unpacked and checked)
        rm -rf .build/cmake-cuda .build/py/llama_cpp/lib
        mkdir -p .build/cmake-cuda
        unpack_xz "$tarball" .build/cmake-cuda || { rm -rf .build/cmake-cuda; return 1; }
    fi
    # pip's editable install (the llama_cpp mapping, the pyqsa command) with the build replaced by
    # staging bin/'s libraries (pyqsa/_build/native.py)
    if ! PYQSA_PREBUILT=1 PYQSA_CUDA=1 python3 -m pip install -q --no-build-isolation --no-deps \
        --no-index -e . || ! prebuilt_check; then
        echo "prebuilt: does not load or run here, building"
        rm -rf .build/cmake-cuda .build/py/llama_cpp/lib
        return 1
    fi
    echo "$have" > "$bin/.prebuilt"
    echo "prebuilt: in place, $(grep -E '^built=' "$stamp")"
}

# It was linked on another system (Debian 12, glibc 2.36, a stand-in libcuda): the libraries load
# through the bindings with the CUDA device seen, and one op-check binary runs its kernels on it
# (sm_90a code from this nvcc on this driver).
prebuilt_check() {
    local bin=.build/cmake-cuda/bin
    if ! python3 -m pyqsa.cli info --json | grep -q '"type": "GPU"'; then
        python3 -m pyqsa.cli info 2>&1 | tail -n 5
        ldd "$bin/libggml-cuda.so" | grep 'not found'
        return 1
    fi
    # (without the device it runs the CPU's checks alone and passes: its CUDA0 lines are
    # required). A CUDA0 check that passed shows the kernels load and run here; a later check's
    # failure is for the op checks to report, which a build here would not mend
    timeout 120 "$bin/test-fused" test -b CUDA0 > /tmp/prebuilt-check.log 2>&1 ||
        echo "prebuilt: test-fused failed a check (the op checks report it): $(tail -n 1 /tmp/prebuilt-check.log)"
    if ! grep -q ' CUDA0: .*OK$' /tmp/prebuilt-check.log; then
        tail -n 15 /tmp/prebuilt-check.log
        return 1
    fi
}

# Upstream's unpatched CUDA `llama`, the comparisons' other side: configured the same way where
# bench/gpu_run.sh builds it on the GPU machine and where tests/gpu/prebuild.sh builds it ahead.
# It links with --exclude-libs,ALL as pyqsa does (native/llama.cmake): on the GPU image's
# toolchain its libraries otherwise export a static libstdc++ copy and libllama crashes while
# loading any model.
#   upstream_configure SRC BUILD_DIR ARCHS EXTRA_LINK_FLAGS [more cmake args]
upstream_configure() {
    local src=$1 dir=$2 archs=$3 link=$4 commit
    shift 4
    commit=$(sed -n 's/^llama_cpp_commit *= *//p' UPSTREAM)
    cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
        -DLLAMA_BUILD_COMMIT="$commit" "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL $link" "$@"
}

# Upstream's llama-quantize of the extract SRC, a CPU-only static build in BUILD_DIR (its program
# BUILD_DIR/bin/llama-quantize), through a two-line project that adds the extract and its
# tools/quantize folder (a carried extract leaves out the tools gpu_run.sh never builds, so the
# extract's own tools list cannot be configured). Used by bench/quant_run.sh on the GPU machine
# and by tests/gpu/prebuild.sh here (PREBUILD_QUANTIZE=1).
#   quantize_build SRC BUILD_DIR JOBS [more cmake args]
quantize_build() {
    local src=$1 dir=$2 jobs=$3
    shift 3
    [ -d "$src/tools/quantize" ] || { echo "quantize_build: no tools/quantize in $src" >&2; return 1; }
    src=$(realpath "$src")  # the project's add_subdirectory lines are read from its own folder
    mkdir -p "$dir/project"
    printf 'cmake_minimum_required(VERSION 3.14)\nproject(upstream_quantize C CXX)\nadd_subdirectory(%s llama.cpp)\nadd_subdirectory(%s/tools/quantize quantize)\n' \
        "$src" "$src" > "$dir/project/CMakeLists.txt"
    cmake -S "$dir/project" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$(realpath "$dir")/bin" "$@" &&
        cmake --build "$dir" -j "$jobs" --target llama-quantize
}

# The pin a carried llama-quantize must name in .gpu-carry/llama-quantize.stamp to be used.
quantize_pin() {
    echo "upstream=$(sed -n 's/^llama_cpp_commit *= *//p' UPSTREAM) llama-quantize"
}

# GPU machine: upstream's build unpacked into DIR/bin from .gpu-carry-upstream/upstream-cuda.tar.xz when
# its stamp names the pinned commit and it loads with the device seen, through the bindings in
# BINDINGS (the extract's llama_cpp, not pyqsa's install, which may be under way beside it);
# status 0, else the caller builds.
#   upstream_prebuilt_install DIR BINDINGS
upstream_prebuilt_install() {
    local dir=$1 bindings=$2 tarball=.gpu-carry-upstream/upstream-cuda.tar.xz
    local stamp=.gpu-carry-upstream/upstream-cuda.stamp want
    [ "${PYQSA_PREBUILT_USE:-1}" = 1 ] && [ -f "$tarball" ] && [ -f "$stamp" ] || return 1
    want="upstream=$(sed -n 's/^llama_cpp_commit *= *//p' UPSTREAM) archs=90a"
    if [ "$(grep -E '^upstream=' "$stamp")" != "$want" ]; then
        echo "prebuilt upstream: not for this pin ($(grep -E '^upstream=' "$stamp"); here: $want), building"
        return 1
    fi
    if [ "$(cat "$dir/bin/.prebuilt" 2> /dev/null)" != "$want" ]; then
        rm -rf "$dir" && mkdir -p "$dir"
        unpack_xz "$tarball" "$dir" || { rm -rf "$dir"; return 1; }
    fi
    if ! PYTHONPATH=$bindings${PYTHONPATH:+:$PYTHONPATH} LLAMA_CPP_LIB_PATH=$PWD/$dir/bin python3 -c 'import llama_cpp as L; L.llama_backend_init()
assert L.llama_supports_gpu_offload()'; then
        echo "prebuilt upstream: does not load with a GPU here, building"
        rm -rf "$dir"
        return 1
    fi
    echo "$want" > "$dir/bin/.prebuilt"
    echo "prebuilt upstream: in place, $(grep -E '^built=' "$stamp")"
}

# What a device run carries, the working tree (tracked and untracked files, not ignored) and
# .gpu-carry, with each of the optional carries (.gpu-carry-upstream: upstream's prebuilt library,
# for calls that run upstream; .gpu-carry-hf: the pinned transformers, for tests/gpu/parity.sh),
# against the device tool's 64 MiB limit: a line each, "over" when it does not fit.
carry_room() {
    local tree base extra total limit=$((64 << 20)) with
    tree=$(git ls-files -co --exclude-standard -z | du --files0-from=- -cb 2> /dev/null | tail -n 1 | cut -f1)
    base=$(du -sb .gpu-carry | cut -f1)
    for with in "" .gpu-carry-upstream .gpu-carry-hf; do
        extra=0
        [ -n "$with" ] && { [ -d "$with" ] || continue; extra=$(du -sb "$with" | cut -f1); }
        total=$((tree + base + extra))
        if [ "$total" -le "$limit" ]; then
            echo "carry .gpu-carry${with:+ + $with}: $total bytes (tree $tree), $((limit - total)) under the 64 MiB limit"
        else
            echo "carry .gpu-carry${with:+ + $with}: over the 64 MiB limit by $((total - limit)) bytes (tree $tree)"
        fi
    done
}
