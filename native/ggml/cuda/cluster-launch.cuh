// Launches over thread-block clusters (sm_90's distributed shared memory): ggml_cuda_kernel_launch's
// launch with the cluster's size.
#pragma once

#include "ggml-cuda/common.cuh"

// whether kernel runs in clusters on the current CUDA device: sm_90 or later, running code built
// for it (not a JIT of older PTX, where the kernels' cluster code is compiled out). Found once a
// device: every kernel of the library is built for the same architectures.
bool pyqsa_cuda_clusters_on(const void * kernel);

// whether kernel launches programmatically (PDL) where ggml_cuda_kernel_launch would: built for
// it, and GGML_CUDA_PDL not 0
bool pyqsa_cuda_pdl_on(const void * kernel);

// kernel over p.block_nums, whose x is a multiple of `size`, in clusters of `size` CTAs along x
template <typename Kernel, typename... Args>
void pyqsa_cuda_cluster_launch(Kernel kernel, const ggml_cuda_kernel_launch_params & p, unsigned size,
                               Args &&... args) {
    cudaLaunchAttribute attr[2]                        = {};
    attr[0].id                                         = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x                           = size;
    attr[0].val.clusterDim.y                           = 1;
    attr[0].val.clusterDim.z                           = 1;
    attr[1].id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg                             = {};
    cfg.gridDim                                        = p.block_nums;
    cfg.blockDim                                       = p.block_dims;
    cfg.dynamicSmemBytes                               = p.shmem;
    cfg.stream                                         = p.stream;
    cfg.attrs                                          = attr;
    cfg.numAttrs                                       = pyqsa_cuda_pdl_on((const void *) kernel) ? 2 : 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
