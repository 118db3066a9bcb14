# Included by the patched ggml/src/ggml-cpu/CMakeLists.txt (ggml_patches/0005): CPU kernels.
target_sources(${GGML_CPU_NAME} PRIVATE
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
    ${CMAKE_CURRENT_LIST_DIR}/cpu/sample.cpp)
target_include_directories(${GGML_CPU_NAME} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cpu)
