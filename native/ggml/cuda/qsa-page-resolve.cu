// CUDA kernel of PYQSA_GGML_OP_QSA_PAGE_RESOLVE, in two launches:
//  1. resolve, one CTA per stream: hits pin their slot; misses claim their table entry (so each
//     distinct block is fetched once) and are sorted by block; the n_miss unpinned slots first in
//     (last use, slot) order are picked and sorted; miss i takes slot i; table, owner and stamp
//     are updated and the selected blocks mapped to their slots. The same order as the CPU
//     kernel, so both give equal state. The slots are picked by a radix select over the H keys
//     (8-bit digits, most significant first) and only the picked ones sorted, so a step costs
//     O(H) plus a sort of its misses, not a sort of all H slots (PYQSA_PAGE_RESOLVE_SORT=1 sorts
//     all H instead, as the kernel did before; the same state either way).
//  2. fetch, one CTA per (miss, stream): copies the block's row from the host store into its hot
//     slot (qsa-page-copy.cuh).
#include "qsa-page-resolve.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-env.h"
#include "pyqsa-ggml.h"
#include "qsa-page-copy.cuh"

#include <algorithm>

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

// slot h's eviction key: (last use + 1) << 32 | h, pinned slots (used this step) last
__device__ __forceinline__ unsigned long long slot_key(const int32_t * stamp, int h, int step) {
    return stamp[h] != step ? ((unsigned long long) (unsigned) (stamp[h] + 1) << 32) | (unsigned) h : ~0ull;
}

// The k-th smallest (1-based) of the H slot keys, which are distinct: a most-significant-digit
// radix select, 8 bits a pass, counting only the keys that match the digits chosen so far (lanes
// with the same digit add their count once: many keys share the high digits).
__device__ unsigned long long kth_slot_key(const int32_t * stamp, int H, int step, int k) {
    __shared__ unsigned int       hist[256];
    __shared__ unsigned long long prefix_s;
    __shared__ int                k_s;
    if (threadIdx.x == 0) {
        prefix_s = 0;
        k_s      = k;
    }
    unsigned long long mask = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += blockDim.x) {
            hist[d] = 0;
        }
        __syncthreads();
        const unsigned long long prefix = prefix_s;
        for (int h0 = 0; h0 < H; h0 += blockDim.x) {  // every lane runs every round: the warp votes together
            const int                h   = h0 + threadIdx.x;
            const unsigned long long key = h < H ? slot_key(stamp, h, step) : 0;
            const bool               in  = h < H && (key & mask) == prefix;
            const unsigned           d   = (unsigned) (key >> shift) & 255u;
            const unsigned           act = __ballot_sync(0xffffffffu, in);
            if (in) {
                const unsigned peers = __match_any_sync(act, d);
                if ((int) (threadIdx.x & 31) == __ffs(peers) - 1) {
                    atomicAdd(&hist[d], (unsigned) __popc(peers));
                }
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) {  // one warp finds the digit holding the k-th key: 8 bins a lane
            const int      lane = threadIdx.x;
            const unsigned kk   = (unsigned) k_s;  // read by every lane before the scan's first shuffle
            unsigned       sum  = 0;
            for (int j = 0; j < 8; ++j) {
                sum += hist[lane * 8 + j];
            }
            unsigned incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
                incl += lane >= o ? v : 0;
            }
            unsigned c = incl - sum;
            if (c < kk && kk <= incl) {
                for (int j = 0; j < 8; ++j) {
                    const unsigned n = hist[lane * 8 + j];
                    if (c + n >= kk) {
                        prefix_s = prefix | ((unsigned long long) (lane * 8 + j) << shift);
                        k_s      = (int) (kk - c);
                        break;
                    }
                    c += n;
                }
            }
        }
        mask |= 0xffull << shift;
        __syncthreads();
    }
    return prefix_s;
}

// SELECT: keys holds the picked slots' keys ([cap] >= n_miss); else every slot's ([cap] >= H)
template <bool SELECT>
__global__ void page_resolve(const int32_t * blocks, const int32_t * n_vis, int32_t * table, int32_t * owner,
                             int32_t * stamp, const int32_t * step_p, long long * stats, int32_t * out,
                             int32_t * miss_out, int32_t * slot_out, int32_t * n_miss_out,
                             int kb, int n_q, int H, int cap, int n_blocks, int32_t * seen) {
    extern __shared__ unsigned long long smem[];
    unsigned long long * keys = smem;                       // [cap] (last use + 1) << 32 | slot
    int32_t *            miss = (int32_t *) (smem + cap);   // [cap] distinct missed blocks

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

    for (int i = n_miss + threadIdx.x; i < cap; i += blockDim.x) {
        miss[i] = INT_MAX;
    }
    if (SELECT) {
        __shared__ int n_picked;
        for (int i = threadIdx.x; i < cap; i += blockDim.x) {
            keys[i] = ~0ull;
        }
        if (threadIdx.x == 0) {
            n_picked = 0;
        }
        __syncthreads();
        if (n_miss > 0) {
            const unsigned long long last = kth_slot_key(stamp, H, step, n_miss);
            for (int h = threadIdx.x; h < H; h += blockDim.x) {
                const unsigned long long key = slot_key(stamp, h, step);
                if (key <= last && key != ~0ull) {
                    keys[atomicAdd(&n_picked, 1)] = key;
                }
            }
        }
    } else {
        for (int h = threadIdx.x; h < cap; h += blockDim.x) {
            keys[h] = h < H ? slot_key(stamp, h, step) : ~0ull;
        }
    }
    bitonic_sort(miss, cap);
    bitonic_sort(keys, cap);

    for (int i = threadIdx.x; i < n_miss; i += blockDim.x) {
        const int slot = (int) (keys[i] & 0xffffffffu);
        const int old  = owner[slot];
        if (old >= 0) {
            table[old] = -1;  // not selected this step, so no other thread touches it
        }
        owner[slot]                    = miss[i];
        stamp[slot]                    = step;
        table[miss[i]]                 = slot;
        miss_out[(size_t) s * cap + i] = miss[i];
        slot_out[(size_t) s * cap + i] = slot;
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

// PYQSA_PAGE_RESOLVE_SORT=1: every slot's key sorted, as the kernel did before the select
bool resolve_sorts_all() {
    static const bool all = pyqsa_env_switch_on("PYQSA_PAGE_RESOLVE_SORT");
    return all;
}

template <bool SELECT>
void launch_resolve(ggml_backend_cuda_context & ctx, ggml_tensor * dst, int cap, int32_t * miss, int32_t * slot,
                    int32_t * n_miss) {
    const ggml_tensor * blocks = dst->src[0];
    const ggml_tensor * hot    = dst->src[7];
    const size_t        smem   = (size_t) cap * (sizeof(unsigned long long) + sizeof(int32_t));
    // past 48 KiB of shared memory, dynamic and static together (the select's histogram), a
    // kernel must opt in to more: done on its first launch on each device, whatever it asks then,
    // since a later launch may ask more (4096 keys of dynamic memory plus the static part was past
    // the limit)
    static bool opted_in[GGML_CUDA_MAX_DEVICES] = {};
    if (!opted_in[ctx.device]) {
        const int most = (int) (PYQSA_PAGE_MAX_SLOTS * (sizeof(unsigned long long) + sizeof(int32_t)));
        CUDA_CHECK(cudaFuncSetAttribute(page_resolve<SELECT>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
        opted_in[ctx.device] = true;
    }
    page_resolve<SELECT><<<(int) blocks->ne[2], THREADS, smem, ctx.stream()>>>(
        (const int32_t *) blocks->data, (const int32_t *) dst->src[1]->data, (int32_t *) dst->src[2]->data,
        (int32_t *) dst->src[3]->data, (int32_t *) dst->src[4]->data, (const int32_t *) dst->src[5]->data,
        (long long *) dst->src[6]->data, (int32_t *) dst->data, miss, slot, n_miss, (int) blocks->ne[0],
        (int) blocks->ne[1], (int) hot->ne[1], cap, (int) dst->src[2]->ne[0],
        dst->src[9] ? (int32_t *) dst->src[9]->data : nullptr);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void pyqsa_cuda_qsa_page_resolve(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * blocks = dst->src[0];
    const ggml_tensor * hot    = dst->src[7];
    const int kb = (int) blocks->ne[0], n_q = (int) blocks->ne[1], ns = (int) blocks->ne[2];
    const int H  = (int) hot->ne[1];
    // a step's distinct misses are at most its selected entries and at most the slots
    const int cap = resolve_sorts_all() ? pow2_at_least(H) : pow2_at_least(std::max(1, std::min(kb * n_q, H)));
    const ggml_tensor * hot_v   = dst->src[8];
    int64_t             n_store = 0;
    const char *        store   = (const char *) pyqsa_ggml_qsa_page_store(dst, 0, &n_store);
    const char *        store_v = (const char *) pyqsa_ggml_qsa_page_store(dst, 1, &n_store);

    ggml_cuda_pool_alloc<int32_t> miss(ctx.pool(), (size_t) ns * cap);
    ggml_cuda_pool_alloc<int32_t> slot(ctx.pool(), (size_t) ns * cap);
    ggml_cuda_pool_alloc<int32_t> n_miss(ctx.pool(), ns);
    if (resolve_sorts_all()) {
        launch_resolve<false>(ctx, dst, cap, miss.get(), slot.get(), n_miss.get());
    } else {
        launch_resolve<true>(ctx, dst, cap, miss.get(), slot.get(), n_miss.get());
    }
    pyqsa_cuda_page_fetch(ctx.stream(), store, (char *) hot->data, store_v, hot_v ? (char *) hot_v->data : nullptr,
                          miss.get(), slot.get(), n_miss.get(), kb * n_q, ns, cap, hot->nb[1],
                          pyqsa_ggml_qsa_page_store_row(dst), pyqsa_cuda_page_q8_elems(dst), hot->nb[2], n_store);
}

bool pyqsa_cuda_qsa_page_resolve_supported(const ggml_tensor * op) {
    return pyqsa_cuda_page_stores_mapped(op) && op->src[7]->ne[1] <= PYQSA_PAGE_MAX_SLOTS &&
           op->src[0]->ne[2] <= 65535;
}
