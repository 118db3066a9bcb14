# Included by the patched src/CMakeLists.txt (ggml_patches/0001) after the llama target exists:
# compiles pyqsa's own sources into libllama.
set(PYQSA_LLAMA_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/src/fused-ops.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/pyqsa-api.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/pyqsa-context.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/pyqsa-debug.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/pyqsa-error.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/pyqsa-imatrix.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/pyqsa-ledger.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/qsa-mask.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/qsa-pager.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/qsa-positional.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/pyqsa-sampler.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/pyqsa-seq-state.cpp
)
target_sources(llama PRIVATE ${CMAKE_CURRENT_LIST_DIR}/include/pyqsa.h ${PYQSA_LLAMA_SOURCES})
set_source_files_properties(${PYQSA_LLAMA_SOURCES} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
target_include_directories(llama PUBLIC ${CMAKE_CURRENT_LIST_DIR}/include)
# internal headers of native/src, included by the patched upstream graph code
target_include_directories(llama PRIVATE ${CMAKE_CURRENT_LIST_DIR}/src)
target_compile_definitions(llama PRIVATE
    PYQSA_VERSION="${PYQSA_VERSION}"
    PYQSA_UPSTREAM_COMMIT="${PYQSA_UPSTREAM_COMMIT}"
)
if (GGML_CUDA)
    target_compile_definitions(llama PRIVATE
        PYQSA_HAS_CUDA
        PYQSA_CUDA_ARCHS="${CMAKE_CUDA_ARCHITECTURES}")
endif()

# op checks of native/ggml (test-backend-ops style): test-qsa-ops [test|perf] [-b BACKEND]
add_executable(test-qsa-ops ${CMAKE_CURRENT_LIST_DIR}/tests/test-qsa-ops.cpp)
target_link_libraries(test-qsa-ops PRIVATE ggml)
target_compile_features(test-qsa-ops PRIVATE cxx_std_17)
# the paging op over multi-step scenarios: test-qsa-page [test|perf|trace] [-b BACKEND]
add_executable(test-qsa-page ${CMAKE_CURRENT_LIST_DIR}/tests/test-qsa-page.cpp)
target_link_libraries(test-qsa-page PRIVATE ggml)
target_compile_features(test-qsa-page PRIVATE cxx_std_17)
# MUL_MAT and MUL_MAT_ID as pyqsa runs them on CUDA: test-products [test|perf] [-b BACKEND]
add_executable(test-products ${CMAKE_CURRENT_LIST_DIR}/tests/test-products.cpp)
target_link_libraries(test-products PRIVATE ggml)
target_compile_features(test-products PRIVATE cxx_std_17)
# GATED_DELTA_NET as pyqsa runs it on CUDA: test-gdn [test|perf] [-b BACKEND]
add_executable(test-gdn ${CMAKE_CURRENT_LIST_DIR}/tests/test-gdn.cpp)
target_link_libraries(test-gdn PRIVATE ggml)
target_compile_features(test-gdn PRIVATE cxx_std_17)
# qwen4exp's fused ops against the graphs of upstream's ops they replace: test-fused [test|perf] [-b BACKEND]
add_executable(test-fused ${CMAKE_CURRENT_LIST_DIR}/tests/test-fused.cpp)
target_link_libraries(test-fused PRIVATE ggml)
target_compile_features(test-fused PRIVATE cxx_std_17)
# the scheduler's input stage and a snapshot head's (src/seq-stage.h) on a backend whose copies are
# queued: test-input-stage [test|perf] [-b BACKEND]
add_executable(test-input-stage ${CMAKE_CURRENT_LIST_DIR}/tests/test-input-stage.cpp)
target_link_libraries(test-input-stage PRIVATE ggml)
target_include_directories(test-input-stage PRIVATE $<TARGET_PROPERTY:ggml-base,SOURCE_DIR>  # ggml-backend-impl.h: a stand-in backend
                                                    ${CMAKE_CURRENT_LIST_DIR}/src)
target_compile_features(test-input-stage PRIVATE cxx_std_17)
# the sample op: test-sample [test|perf] [-b BACKEND]
add_executable(test-sample ${CMAKE_CURRENT_LIST_DIR}/tests/test-sample.cpp)
target_link_libraries(test-sample PRIVATE ggml)
target_compile_features(test-sample PRIVATE cxx_std_17)

# Each shared library keeps the symbols of the static archives it links to itself. The CUDA image's
# toolchain links a static libstdc++ into the libraries; exported, one library's copy interposed
# libllama's std:: references (libllama did not even list libstdc++.so) and the first
# stringstream in llama_model::print_info crashed on a copy whose locale was never set up.
# tests/unit/test_build.py checks that no library exports such definitions.
foreach(lib llama ggml ggml-base ggml-cpu ggml-cuda)
    if (TARGET ${lib})
        target_link_options(${lib} PRIVATE "LINKER:--exclude-libs,ALL")
    endif()
endforeach()
