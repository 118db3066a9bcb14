# Included by the patched ggml/src/CMakeLists.txt (ggml_patches/0005): op constructors, the
# lazily committed host buffer type, the host sampler and the scheduler's input stage.
target_sources(ggml-base PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/pyqsa-ops.cpp
    ${CMAKE_CURRENT_LIST_DIR}/lazy-host-buffer.cpp
    ${CMAKE_CURRENT_LIST_DIR}/sample-row.cpp
    ${CMAKE_CURRENT_LIST_DIR}/input-stage.cpp)
target_include_directories(ggml-base PUBLIC ${CMAKE_CURRENT_LIST_DIR}/../include)
