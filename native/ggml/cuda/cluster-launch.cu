// Launches over thread-block clusters (see cluster-launch.cuh).
#include "cluster-launch.cuh"

#include <cstdlib>

bool pyqsa_cuda_clusters_on(const void * kernel) {
    static int on[GGML_CUDA_MAX_DEVICES] = {};  // 0 unknown, 1 yes, 2 no
    const int  device                    = ggml_cuda_get_device();
    if (on[device] == 0) {
        const int cc  = ggml_cuda_info().devices[device].cc;
        bool      yes = false;
        if (GGML_CUDA_CC_IS_NVIDIA(cc) && cc >= GGML_CUDA_CC_HOPPER) {
            cudaFuncAttributes attr = {};
            CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
            yes = attr.ptxVersion >= 90;
        }
        on[device] = yes ? 1 : 2;
    }
    return on[device] == 1;
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
