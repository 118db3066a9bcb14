// Launches over thread-block clusters (see cluster-launch.cuh).
#include "cluster-launch.cuh"

#include <cstdlib>

bool pyqsa_cuda_clusters_on(const void * kernel) {
    const int cc = ggml_cuda_info().devices[ggml_cuda_get_device()].cc;
    if (!GGML_CUDA_CC_IS_NVIDIA(cc) || cc < GGML_CUDA_CC_HOPPER) {
        return false;
    }
    cudaFuncAttributes attr = {};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.ptxVersion >= 90;
}

bool pyqsa_cuda_pdl_on(const void * kernel) {
#if defined(GGML_CUDA_USE_PDL)
    static const bool env_on = [] {
        const char * env = std::getenv("GGML_CUDA_PDL");
        return env == nullptr || std::atoi(env) != 0;
    }();
    return env_on && ggml_cuda_kernel_can_use_pdl(kernel);
#else
    GGML_UNUSED(kernel);
    return false;
#endif
}
