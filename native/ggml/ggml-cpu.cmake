# Included by the patched ggml/src/ggml-cpu/CMakeLists.txt (ggml_patches/0005): CPU kernels.
target_sources(${GGML_CPU_NAME} PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cpu/add-gated.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/conv-step.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/gdn-gates.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/hc-combine.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/hc-mix.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/pyqsa-cpu.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-attn.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-attn-part.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-block-cells.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-mask-cells.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-page-convert.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-page-fetch.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-page-resolve.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-page-stage.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-page-write.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-score.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/qsa-topk.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/rms-norm-gated.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/sample.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/silu-scaled.cpp)
target_include_directories(${GGML_CPU_NAME} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cpu)
# the ops' sums rounded as upstream's CPU ops round them, a product then an add (GCC would contract
# them into an FMA, which rounds once): the fused graphs equal the unfused ones bit for bit
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu/add-gated.cpp ${CMAKE_CURRENT_LIST_DIR}/cpu/hc-combine.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/rms-norm-gated.cpp
    PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
