#!/usr/bin/env bash
# GPU machine, after the CUDA variant is built (tests/gpu/backend_ops.sh, which also runs
# test-qsa-page's CUDA-vs-CPU checks of the paging ops): host-backed KV paging in the model
# graph on CUDA, every layer on the GPU: paged logits equal to unpaged bit for bit
# (tests/unit/test_paging.py, the same test CI runs on the CPU).
#   device run: carry [".gpu-carry"], command: tests/gpu/backend_ops.sh && tests/gpu/paging.sh
exec "$(dirname "$0")/cuda_pytest.sh" paging tests/unit/test_paging.py
