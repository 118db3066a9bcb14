// The dev corner's timing: a launch's time as the median over 20 CUDA graphs of n launches each
// (a first graph warms up and is not counted).
#pragma once

#include "cuda-check.cuh"

#include <algorithm>
#include <vector>

struct launch_times {
    float median, min, max;  // us a launch
};

// launch(i) enqueues the i-th launch of a graph on stream st (i < n)
template <typename Launch> launch_times time_launches(cudaStream_t st, int n, const Launch & launch) {
    cudaGraph_t     g;
    cudaGraphExec_t ge;
    CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; ++i) {
        launch(i);
    }
    CHECK_CUDA(cudaStreamEndCapture(st, &g));
    CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<float> us;
    for (int rep = 0; rep < 21; ++rep) {
        CHECK_CUDA(cudaEventRecord(e0, st));
        CHECK_CUDA(cudaGraphLaunch(ge, st));
        CHECK_CUDA(cudaEventRecord(e1, st));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0) {
            us.push_back(ms * 1000.0f / n);
        }
    }
    std::sort(us.begin(), us.end());
    CHECK_CUDA(cudaGraphExecDestroy(ge));
    CHECK_CUDA(cudaGraphDestroy(g));
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    return { us[us.size() / 2], us.front(), us.back() };
}
