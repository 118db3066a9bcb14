# Included by the patched ggml/src/ggml-cuda/CMakeLists.txt (ggml_patches/0005): CUDA kernels.
target_sources(ggml-cuda PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cuda/add-gated.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/cluster-launch.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/conv-step.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/gdn-gates.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/gdn-prefill.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/gemv-f16.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/hc-combine.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/hc-mix.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/moe-gemm.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/product-groups.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/pyqsa-cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-attn.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-attn-mma.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-attn-part.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-block-cells.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-mask-cells.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-page-copy.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-page-fetch.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-page-resolve.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-page-stage.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-page-write.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-score.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-score-mma.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-topk.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/rms-norm-gated.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/sample.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/silu-scaled.cu)
target_include_directories(ggml-cuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda)
