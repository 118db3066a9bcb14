// CUDA dispatch of GGML_OP_PYQSA (called from the patched ggml-cuda.cu).
#pragma once

#include "ggml-cuda/common.cuh"

void pyqsa_cuda_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

bool pyqsa_cuda_supports_op(const ggml_tensor * op);

// node i of cgraph is a GGML_OP_PYQSA: runs it with the nodes after it that one launch can take
// too and returns how many nodes after i it ran, or returns 0 having run nothing (called from
// the patched ggml_cuda_try_fuse)
int pyqsa_cuda_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);

// whether the bytes of tensors a and b overlap (false where one is nullptr): a fused launch whose CTAs write one while others
// read the other would race
bool pyqsa_cuda_bytes_overlap(const ggml_tensor * a, const ggml_tensor * b);

// whether graph node t launches nothing, as the CUDA backend's graph loop skips it: empty, a view,
// reshape, permute or transpose, or not computed (a fusion may take the nodes on both sides of it)
bool pyqsa_cuda_node_is_noop(const ggml_tensor * t);

// whether the GPU can read p in place: device or pinned host memory, not pageable
bool pyqsa_cuda_host_mapped(const void * p);

// a compute of a graph: run kernel by kernel (use_graph false: a CUDA graph is off, warming up or
// its properties changed), captured into a CUDA graph (capture) or a replay of the one it has
// (called from the patched ggml_backend_cuda_graph_compute)
void pyqsa_cuda_graph_count(bool use_graph, bool capture);

// the counts since the process started: out[0] run kernel by kernel, out[1] captured, out[2]
// replayed (given by the CUDA backend's get_proc_address as "pyqsa_cuda_graph_counts")
void pyqsa_cuda_graph_counts(uint64_t * out);

// ggml's CUDA memory pools grew (delta > 0) or gave memory back (delta < 0): the temporaries of
// kernels, held from their largest use on (ggml_cuda_pool_leg / _vmm, counted by patch 0019)
void pyqsa_cuda_pool_resized(int64_t delta);

// the device bytes every CUDA memory pool of the process holds now (given by the CUDA backend's
// get_proc_address as "pyqsa_cuda_pool_bytes")
uint64_t pyqsa_cuda_pool_bytes();

// Raises the per-thread stack of CUDA device `device` to at least min_per_thread bytes (0: leaves
// it) and counts the device in pyqsa_cuda_stack_bytes from then on. Returns false for a device
// the backend lacks. (given by the CUDA backend's get_proc_address as "pyqsa_cuda_stack_raise")
bool pyqsa_cuda_stack_raise(int device, size_t min_per_thread);

// the device bytes the thread stacks of the devices counted so far hold beyond what they held when
// first counted (part of the CUDA context): each device's growth of its per-thread stack times the
// threads it holds at once (given by the CUDA backend's get_proc_address as
// "pyqsa_cuda_stack_bytes")
uint64_t pyqsa_cuda_stack_bytes();
