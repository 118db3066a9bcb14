#!/usr/bin/env bash
# Run HERE before a device run of bench/gpu_run.sh (the GPU machine has no network): the carry
# of tests/gpu/pack.sh (upstream extract, wheels, Qwen vocab GGUF), made when missing, and the
# commands to send. The machine's image has gguf's and tqdm's dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
# (the server's wheels, the openai client and .gpu-carry-hf came later: a carry without them is made again)
[ -f .gpu-carry/upstream-extract.tar.gz ] && [ -f .gpu-carry/ggml-vocab-qwen35.gguf ] && [ -d .gpu-carry-hf ] &&
    compgen -G ".gpu-carry/openai-*.whl" > /dev/null || tests/gpu/pack.sh
du -sh .gpu-carry
. tests/gpu/prebuilt.sh
if grep -q "^inputs=$(prebuilt_inputs .) " .gpu-carry/prebuilt-cuda.stamp 2> /dev/null; then
    echo "the carry's prebuilt CUDA build is this tree's: the device skips pyqsa's build"
else
    echo "NOTE: no prebuilt CUDA build of this tree: tests/gpu/prebuild.sh here saves the device pyqsa's CUDA build (~325 s)"
fi
if grep -q "^upstream=$(sed -n 's/^llama_cpp_commit *= *//p' UPSTREAM) " .gpu-carry-upstream/upstream-cuda.stamp 2> /dev/null; then
    echo "the prebuilt upstream library (.gpu-carry-upstream) is this pin's: a call carrying it skips upstream's build"
fi
carry_room
head=$(git rev-parse HEAD)
git diff --quiet HEAD -- ggml_patches native pyqsa bench setup.py ||
    echo "NOTE: tracked files differ from HEAD; the device runs this working tree, not $head"
echo "device command: bench/gpu_run.sh --commit $head --contexts 8192,32768 --budget 540"
echo "source digest here: $(python3 -c 'from pyqsa.bench.meta import source_digest; print(source_digest())')"
