#!/usr/bin/env bash
# Run HERE before a device run of bench/gpu_run.sh (the GPU machine has no network): the carry
# of tests/gpu/pack.sh (upstream extract, wheels) plus the Qwen vocab GGUF, which that pack
# leaves out with the rest of models/. The machine's image has gguf's and tqdm's dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu-carry/upstream-extract.tar.gz ] || tests/gpu/pack.sh
root=$(python3 -c "import sys; sys.path.insert(0,'.'); from pyqsa._build import upstream as u; print(u.fetch())")
cp "$root/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf" .gpu-carry/
du -sh .gpu-carry
