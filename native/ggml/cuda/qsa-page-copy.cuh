// Row copies of the paging ops (qsa-page-*.cu): a device row copy, and the fetch of blocks from
// a host store (pinned memory, read over PCIe without a staging copy) into device slots.
#pragma once

#include "ggml-cuda/common.cuh"

// B bytes from src to dst by the calling CTA, 16 at a time when both are aligned
__device__ __forceinline__ void pyqsa_copy_row(char * dst, const char * src, size_t B) {
    if (B % 16 == 0 && ((uintptr_t) src | (uintptr_t) dst) % 16 == 0) {
        for (size_t o = threadIdx.x * 16; o < B; o += blockDim.x * 16) {
            *(int4 *) (dst + o) = *(const int4 *) (src + o);
        }
    } else {
        for (size_t o = threadIdx.x; o < B; o += blockDim.x) {
            dst[o] = src[o];
        }
    }
}

// q8_0 blocks (34 bytes: f16 scale, 32 int8) a CTA brings into shared memory at a time; 128 of
// them are 4352 bytes, a multiple of 16, so every chunk of a 16-byte aligned row stays aligned
constexpr int PYQSA_Q8_CHUNK_BLOCKS = 128;

// n elements (a multiple of 32) of a q8_0 store row into f16 by the calling CTA (every thread
// of it calls, as it synchronizes). The row is read over PCIe, so it comes over in chunks of
// 16-byte loads into shared memory and is dequantized from there: element-wise loads of host
// memory (a scale and a byte per element) moved half the bytes of an f16 row in more time.
// d * q in f32 (exact), rounded to nearest: the CPU kernels' dequantize-then-convert values.
__device__ __forceinline__ void pyqsa_copy_row_q8_0_f16(char * dst, const char * src, int n) {
    __shared__ __align__(16) char chunk[PYQSA_Q8_CHUNK_BLOCKS * 34];
    const bool vec = (uintptr_t) src % 16 == 0;
    for (int b0 = 0; b0 < n / 32; b0 += PYQSA_Q8_CHUNK_BLOCKS) {
        const int    nb    = min(PYQSA_Q8_CHUNK_BLOCKS, n / 32 - b0);
        const int    bytes = nb * 34;
        const char * from  = src + (size_t) b0 * 34;
        const int    n16   = vec ? bytes / 16 : 0;
        for (int o = threadIdx.x; o < n16; o += blockDim.x) {
            ((int4 *) chunk)[o] = ((const int4 *) from)[o];
        }
        for (int o = n16 * 16 + threadIdx.x; o < bytes; o += blockDim.x) {
            chunk[o] = from[o];
        }
        __syncthreads();
        for (int e = threadIdx.x; e < nb * 32; e += blockDim.x) {
            const char * blk = chunk + (e / 32) * 34;
            const float  d   = __half2float(*(const half *) blk);
            ((half *) dst)[(size_t) b0 * 32 + e] = __float2half_rn(d * (float) (int8_t) blk[2 + e % 32]);
        }
        __syncthreads();  // the chunk is read before the next one overwrites it
    }
}

// a block of the store into the device rows: byte for byte, or dequantized (q8_0 into f16); by
// every thread of the calling CTA
__device__ __forceinline__ void pyqsa_fetch_row(char * dst, const char * src, size_t B, int n_q8) {
    if (n_q8 > 0) {
        pyqsa_copy_row_q8_0_f16(dst, src, n_q8);
    } else {
        pyqsa_copy_row(dst, src, B);
    }
}

// Per stream s and i < n_blocks[s] (at most max_blocks): block blocks[s * stride + i] of the
// stream's store (K, and V when store1 is set) to slot slots[s * stride + i] of its device rows;
// B bytes a block on the device, B_store in the store (n_q8 > 0: a q8_0 store of n_q8 elements a
// block, dequantized into f16 rows), streams n_store blocks apart in the store and stream_bytes
// apart on the device.
void pyqsa_cuda_page_fetch(cudaStream_t stream, const char * store0, char * dev0, const char * store1, char * dev1,
                           const int32_t * blocks, const int32_t * slots, const int32_t * n_blocks, int max_blocks,
                           int ns, int stride, size_t B, size_t B_store, int n_q8, size_t stream_bytes,
                           long long n_store);

// n_q8 for pyqsa_cuda_page_fetch of a page node: its blocks' elements when the store is q8_0
// beside f16 device rows, else 0
int pyqsa_cuda_page_q8_elems(const ggml_tensor * op);

// Whether a fetching op's host stores (pyqsa_ggml_qsa_page_store: K, and V when it has one) are
// pinned or device memory, which the kernels read in place; pageable memory they cannot read.
bool pyqsa_cuda_page_stores_mapped(const ggml_tensor * op);
