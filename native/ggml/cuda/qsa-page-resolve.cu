// CUDA kernel of PYQSA_GGML_OP_QSA_PAGE_RESOLVE, in two launches:
//  1. resolve, one CTA per stream: hits pin their slot; misses claim their table entry (so each
//     distinct block is fetched once) and are sorted by block; the unpinned slots are sorted by
//     (last use, slot); miss i takes slot i; table, owner and stamp are updated and the selected
//     blocks mapped to their slots. The same order as the CPU kernel, so both give equal state.
//  2. fetch, one CTA per (miss, stream): copies the block's row from the host store into its hot
//     slot (qsa-page-copy.cuh).
#include "qsa-page-resolve.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"
#include "qsa-page-copy.cuh"

namespace {

constexpr int THREADS = 1024;

// in-place ascending bitonic sort of n (a power of two) keys in shared memory
template <typename T>
__device__ void bitonic_sort(T * keys, int n) {
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool up = (i & size) == 0;
                    if ((keys[i] > keys[j]) == up) {
                        const T t = keys[i];
                        keys[i]   = keys[j];
                        keys[j]   = t;
                    }
                }
            }
        }
    }
    __syncthreads();
}

__global__ void page_resolve(const int32_t * blocks, const int32_t * n_vis, int32_t * table, int32_t * owner,
                             int32_t * stamp, const int32_t * step_p, long long * stats, int32_t * out,
                             int32_t * miss_out, int32_t * slot_out, int32_t * n_miss_out,
                             int kb, int n_q, int H, int Hp, int n_blocks, int32_t * seen) {
    extern __shared__ unsigned long long smem[];
    unsigned long long * keys = smem;                       // [Hp] (last use + 1) << 32 | slot
    int32_t *            miss = (int32_t *) (smem + Hp);    // [Hp] distinct missed blocks

    const int s    = blockIdx.x;
    const int M    = kb * n_q;
    const int step = step_p[0];
    const bool reset = seen != nullptr && seen[s] != step_p[1 + s];
    blocks += (size_t) s * M;
    n_vis += (size_t) s * n_q;
    table += (size_t) s * n_blocks;
    owner += (size_t) s * H;
    stamp += (size_t) s * H;
    out += (size_t) s * M;

    __shared__ int n_miss;
    __shared__ int hits;
    if (threadIdx.x == 0) {
        n_miss = 0;
        hits   = 0;
    }
    if (reset) {  // a new generation of the stream: nothing resident is valid
        for (int b = threadIdx.x; b < n_blocks; b += blockDim.x) {
            table[b] = -1;
        }
        for (int h = threadIdx.x; h < H; h += blockDim.x) {
            owner[h] = -1;
            stamp[h] = -1;
        }
    }
    __syncthreads();

    for (int e = threadIdx.x; e < M; e += blockDim.x) {
        const int b = blocks[e];
        if (b >= n_vis[e / kb]) {
            continue;
        }
        const int slot = table[b];
        if (slot >= 0) {
            stamp[slot] = step;
            atomicAdd(&hits, 1);
        } else if (atomicCAS(&table[b], -1, -2) == -1) {  // the first to claim fetches it
            miss[atomicAdd(&n_miss, 1)] = b;
        }
    }
    __syncthreads();

    for (int i = n_miss + threadIdx.x; i < Hp; i += blockDim.x) {
        miss[i] = INT_MAX;
    }
    for (int h = threadIdx.x; h < Hp; h += blockDim.x) {
        keys[h] = h < H && stamp[h] != step ? ((unsigned long long) (unsigned) (stamp[h] + 1) << 32) | (unsigned) h
                                            : ~0ull;
    }
    bitonic_sort(miss, Hp);
    bitonic_sort(keys, Hp);

    for (int i = threadIdx.x; i < n_miss; i += blockDim.x) {
        const int slot = (int) (keys[i] & 0xffffffffu);
        const int old  = owner[slot];
        if (old >= 0) {
            table[old] = -1;  // not selected this step, so no other thread touches it
        }
        owner[slot]                    = miss[i];
        stamp[slot]                    = step;
        table[miss[i]]                 = slot;
        miss_out[(size_t) s * Hp + i]  = miss[i];
        slot_out[(size_t) s * Hp + i]  = slot;
    }
    if (threadIdx.x == 0) {
        n_miss_out[s] = n_miss;
        stats[2 * s] += hits;
        stats[2 * s + 1] += n_miss;
        if (seen != nullptr) {
            seen[s] = step_p[1 + s];
        }
    }
    __syncthreads();

    for (int e = threadIdx.x; e < M; e += blockDim.x) {
        const int b = blocks[e];
        out[e]      = b < n_vis[e / kb] ? table[b] : -1;
    }
}

int pow2_at_least(int n) {
    int p = 1;
    while (p < n) {
        p <<= 1;
    }
    return p;
}

}  // namespace

void pyqsa_cuda_qsa_page_resolve(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * blocks = dst->src[0];
    const ggml_tensor * table  = dst->src[2];
    const ggml_tensor * hot    = dst->src[7];
    const int kb = (int) blocks->ne[0], n_q = (int) blocks->ne[1], ns = (int) blocks->ne[2];
    const int H  = (int) hot->ne[1];
    const int Hp = pow2_at_least(H);
    const ggml_tensor * hot_v   = dst->src[8];
    int64_t             n_store = 0;
    const char *        store   = (const char *) pyqsa_ggml_qsa_page_store(dst, 0, &n_store);
    const char *        store_v = (const char *) pyqsa_ggml_qsa_page_store(dst, 1, &n_store);

    ggml_cuda_pool_alloc<int32_t> miss(ctx.pool(), (size_t) ns * Hp);
    ggml_cuda_pool_alloc<int32_t> slot(ctx.pool(), (size_t) ns * Hp);
    ggml_cuda_pool_alloc<int32_t> n_miss(ctx.pool(), ns);
    const size_t smem = (size_t) Hp * (sizeof(unsigned long long) + sizeof(int32_t));
    // past 48 KiB (over 4096 slots) a kernel must opt in to more shared memory, once per device
    static bool opted_in[GGML_CUDA_MAX_DEVICES] = {};
    if (smem > 48 * 1024 && !opted_in[ctx.device]) {
        const int most = (int) (PYQSA_PAGE_MAX_SLOTS * (sizeof(unsigned long long) + sizeof(int32_t)));
        CUDA_CHECK(cudaFuncSetAttribute(page_resolve, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
        opted_in[ctx.device] = true;
    }
    page_resolve<<<ns, THREADS, smem, ctx.stream()>>>(
        (const int32_t *) blocks->data, (const int32_t *) dst->src[1]->data, (int32_t *) table->data,
        (int32_t *) dst->src[3]->data, (int32_t *) dst->src[4]->data, (const int32_t *) dst->src[5]->data,
        (long long *) dst->src[6]->data, (int32_t *) dst->data, miss.get(), slot.get(), n_miss.get(), kb, n_q, H, Hp,
        (int) table->ne[0], dst->src[9] ? (int32_t *) dst->src[9]->data : nullptr);
    CUDA_CHECK(cudaGetLastError());
    pyqsa_cuda_page_fetch(ctx.stream(), store, (char *) hot->data, store_v, hot_v ? (char *) hot_v->data : nullptr,
                          miss.get(), slot.get(), n_miss.get(), kb * n_q, ns, Hp, hot->nb[1], hot->nb[2], n_store);
}

bool pyqsa_cuda_qsa_page_resolve_supported(const ggml_tensor * op) {
    return pyqsa_cuda_page_stores_mapped(op) && op->src[7]->ne[1] <= PYQSA_PAGE_MAX_SLOTS &&
           op->src[0]->ne[2] <= 65535;
}
