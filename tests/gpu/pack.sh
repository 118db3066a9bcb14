#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device run: the GPU machine has no network and the
# pinned sdist (76 MB) is over the device tool's carry limit, so carry a trimmed copy of the
# verified extract (without models/docs) plus the wheels the image lacks and the Qwen vocab GGUF
# (tests and the models build on it), in .gpu-carry/; the pinned transformers wheel (HF's side of
# tests/gpu/parity.sh, 13 MB) in .gpu-carry-hf/, a carry of its own: with .gpu-carry and
# .gpu-carry-upstream (tests/gpu/prebuild.sh) it would pass the 64 MiB limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(python3 -c "import sys; sys.path.insert(0,'.'); from pyqsa._build import upstream as u; print(u.fetch())")
mkdir -p .gpu-carry
tar -C "$(dirname "$root")" -czf .gpu-carry/upstream-extract.tar.gz \
    --exclude='vendor/llama.cpp/models/ggml-vocab-*' --exclude='vendor/llama.cpp/docs' \
    --exclude='vendor/llama.cpp/benches' --exclude='vendor/llama.cpp/media' \
    --exclude="$(basename "$root")/.git" --exclude='vendor/llama.cpp/tools/ui' \
    --exclude='vendor/llama.cpp/tools/mtmd' --exclude='*.mp4' --exclude='*.webp' \
    --exclude='ggml-opencl' --exclude='ggml-vulkan' \
    --exclude='docs' --exclude='examples' \
    "$(basename "$root")"
# the image lacks these; the server's stack (tests/gpu/serve_paged.sh) and the openai client
# (the e2e tests of tests/gpu/sampling.sh) come last
for w in cffi==2.1.1 pycparser==2.23 gguf==0.19.0 diskcache==5.6.3 \
    fastapi==0.165.0 starlette==1.10.0 sse-starlette==3.7.0 uvicorn==0.54.0 pydantic==2.14.4 \
    pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
    opentelemetry-api==1.45.2 openai==3.57.0 jiter==0.19.0 sniffio==1.3.1 httpx2==2.16.2 \
    httpcore2==2.16.2 truststore==0.10.5; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .gpu-carry "$w"
done
mkdir -p .gpu-carry-hf
python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu-carry-hf \
    "transformers==$(sed -n 's/^transformers==//p' constraints.txt)"
cp "$root/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf" .gpu-carry/
du -sh .gpu-carry/* .gpu-carry-hf/*
