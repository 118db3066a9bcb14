# Included by the patched ggml/src/ggml-cuda/CMakeLists.txt (ggml_patches/0005): CUDA kernels.
target_sources(ggml-cuda PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cuda/pyqsa-cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-attn.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-block-cells.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-mask-cells.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/qsa-topk.cu)
target_include_directories(ggml-cuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda)
# export ggml's C API only, also when a std:: definition comes from an object rather than an
# archive (native/llama.cmake hides archives): see cuda/ggml-cuda.map
target_link_options(ggml-cuda PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/cuda/ggml-cuda.map")
set_property(TARGET ggml-cuda APPEND PROPERTY LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cuda/ggml-cuda.map)
