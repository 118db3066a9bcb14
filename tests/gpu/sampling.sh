#!/usr/bin/env bash
# GPU machine, after the CUDA variant is built (tests/gpu/backend_ops.sh, which also runs
# test-sample's CUDA-vs-CPU checks of the sample op): the engine's draws inside the forward pass
# (--sampling device: the op on CUDA after the logits) and on the host, against the numpy
# reference, every layer on the GPU (the tests CI runs on the CPU); then the servers: --sampling
# device against host over HTTP, and the cancellation storms (on the device, paged, and with
# device draws switching to host ones).
#   device run: carry [".gpu-carry"], command: tests/gpu/backend_ops.sh && tests/gpu/sampling.sh
exec "$(dirname "$0")/cuda_pytest.sh" sampling tests/unit/test_engine_device_sampling.py \
    tests/unit/test_native_sampler.py tests/e2e/test_server_device_sampling.py \
    tests/e2e/test_server_cancel.py::test_cancellation_storm_leaves_no_trace
