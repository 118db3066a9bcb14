// A decode step's products of one activation in one launch. qwen4exp's decode graph reads each x
// with several small MUL_MATs: the linear attention's input four (qkv, alpha, beta, z), the
// attention's five (q and gate, k, v, the indexer's q and k), every hyper-connection norm two
// (down and inject); 252 launches of the 48-layer model's step at 1-8 sequences (the f32 router
// and shared-expert gate are not the gemv's). Each was a kernel of a few microseconds, mostly
// launch and ramp time at one sequence: a step had 2522 kernels on the H200
// (bench/results/2026-12-04-2d244c6-kernels.txt), ~2140 since the fused hyper-connection ops.
// Called from the patched ggml-cuda.cu (ggml_patches/0020):
//   graph_optimize (before the graph is allocated): each x's products that one launch can take
//     (weights of one type the gemv reads, f16 or quantized: a quantized file's q4_K projections
//     of an x join, its q6_K one apart; 1-8 columns; none of upstream's fusions to them) are
//     moved next to the first of them. Only reads of x and of weights move, earlier, so the
//     order stays valid; one whose x is written between stays.
//   graph_compute: such a run of MUL_MATs goes to pyqsa_cuda_gemv_group, one launch, each row
//     summed as the gemv sums it alone (the same bits wherever the gemv takes the product alone).
//     At one column a run whose rows are too few for two a warp (a hyper-connection norm's down
//     and inject) runs product by product, on upstream's MMVF (MMVQ), which is faster there.
// PYQSA_CUDA_PRODUCTS_UNGROUPED=1 turns both off (read at every call, so that test-products runs
// both ways in one process).
#pragma once

#include "ggml-cuda/common.cuh"

// PYQSA_CUDA_PRODUCTS_UNGROUPED unset or "0" (pyqsa-cuda.cu reads it at every call)
bool pyqsa_cuda_products_grouped();

// moves the MUL_MATs that one launch can take next to the first of each x's (graph_optimize)
void pyqsa_cuda_group_products(ggml_cgraph * cgraph);

// node i of cgraph is a MUL_MAT: runs it and the MUL_MATs of its x right after it in one launch
// and returns how many nodes after i it ran, or returns 0 having run nothing
int pyqsa_cuda_try_group(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);

// the counts since the process started: out[0] launches of grouped products, out[1] the products
// they ran (given by the CUDA backend's get_proc_address as "pyqsa_cuda_group_counts")
void pyqsa_cuda_group_counts(uint64_t * out);
