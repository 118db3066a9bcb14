// CUDA kernels of PYQSA_GGML_OP_QSA_PAGE_WRITE, _PAGE_STAGE (a bitmap of the selected stored
// blocks, ranked by a popcount prefix, then the fetch below) and _PAGE_RESOLVE, the latter in
// two launches:
//  1. resolve, one CTA per stream: hits pin their slot; misses claim their table entry (so each
//     distinct block is fetched once) and are sorted by block; the unpinned slots are sorted by
//     (last use, slot); miss i takes slot i; table, owner and stamp are updated and the selected
//     blocks mapped to their slots. The same order as the CPU kernel, so both give equal state.
//  2. fetch, one CTA per (miss, stream): copies the block's row from the host store (pinned
//     memory, read over PCIe without a staging copy) into its hot slot.
#include "qsa-page.cuh"

#include "pyqsa-cuda.cuh"
#include "pyqsa-ggml.h"

#include <cub/cub.cuh>

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

// grid (i, stream, K or V): block miss[i] of the stream from the store to its slot (slot[i], or
// i itself when slot is null)
__global__ void page_fetch(const char * store0, char * hot0, const char * store1, char * hot1, const int32_t * miss,
                           const int32_t * slot, const int32_t * n_miss, size_t B, size_t stream_bytes, int Hp,
                           long long n_store) {
    const int s = blockIdx.y;
    const int i = blockIdx.x;
    if (i >= n_miss[s]) {
        return;
    }
    const char * store = blockIdx.z == 0 ? store0 : store1;
    char *       hot   = blockIdx.z == 0 ? hot0 : hot1;
    const int    to    = slot ? slot[(size_t) s * Hp + i] : i;
    const char * src = store + ((size_t) s * n_store + miss[(size_t) s * Hp + i]) * B;
    char *       dst = hot + (size_t) s * stream_bytes + (size_t) to * B;
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

int pow2_at_least(int n) {
    int p = 1;
    while (p < n) {
        p <<= 1;
    }
    return p;
}

constexpr int STAGE_THREADS = 1024;

// one CTA per stream: a bitmap of the stream's selected stored blocks, its popcount prefix (the
// rank of each block in increasing order), each selection's slot (its rank, below S) and the
// list of staged blocks by slot
__global__ void page_stage_rank(const int32_t * blocks, const int32_t * n_paged, uint32_t * bits, int32_t * rank0,
                                int32_t * list, int32_t * n_staged, int32_t * out, int kb, int n_q, int n_words,
                                int S) {
    using block_scan = cub::BlockScan<int, STAGE_THREADS>;
    __shared__ typename block_scan::TempStorage scan_tmp;

    const int s = blockIdx.x;
    const int M = kb * n_q;
    blocks += (size_t) s * M;
    out += (size_t) s * M;
    n_paged += (size_t) s * n_q;
    bits += (size_t) s * n_words;
    rank0 += (size_t) s * n_words;
    list += (size_t) s * S;

    for (int w = threadIdx.x; w < n_words; w += blockDim.x) {
        bits[w] = 0;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < M; e += blockDim.x) {
        const int b = blocks[e];
        if (b < n_paged[e / kb]) {
            atomicOr(&bits[b >> 5], 1u << (b & 31));
        }
    }
    __syncthreads();

    // each thread a contiguous run of words, so ranks follow block order
    const int per = (n_words + blockDim.x - 1) / blockDim.x;
    const int w0  = min(n_words, (int) threadIdx.x * per);
    const int w1  = min(n_words, w0 + per);
    int       local = 0;
    for (int w = w0; w < w1; ++w) {
        local += __popc(bits[w]);
    }
    int before = 0, total = 0;
    block_scan(scan_tmp).ExclusiveSum(local, before, total);
    for (int w = w0; w < w1; ++w) {
        rank0[w] = before;
        before += __popc(bits[w]);
    }
    __syncthreads();

    for (int e = threadIdx.x; e < M; e += blockDim.x) {
        const int b    = blocks[e];
        int       slot = -1;
        if (b < n_paged[e / kb]) {
            const int rank = rank0[b >> 5] + __popc(bits[b >> 5] & ((1u << (b & 31)) - 1u));
            slot           = rank < S ? rank : -1;
        }
        out[e] = slot;
    }
    for (int w = w0; w < w1; ++w) {
        uint32_t word = bits[w];
        for (int rank = rank0[w]; word != 0 && rank < S; ++rank) {
            list[rank] = w * 32 + __ffs(word) - 1;
            word &= word - 1;
        }
    }
    if (threadIdx.x == 0) {
        n_staged[s] = min(total, S);
    }
}

}  // namespace

void pyqsa_cuda_qsa_page_stage(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * blocks  = dst->src[0];
    const ggml_tensor * stage   = dst->src[2];
    const ggml_tensor * stage_v = dst->src[3];
    const int kb = (int) blocks->ne[0], n_q = (int) blocks->ne[1], ns = (int) blocks->ne[2];
    const int S  = (int) stage->ne[1];
    int64_t      n_store = 0;
    const char * store   = (const char *) pyqsa_ggml_qsa_page_store(dst, 0, &n_store);
    const char * store_v = (const char *) pyqsa_ggml_qsa_page_store(dst, 1, &n_store);
    const int    n_words = (int) ((n_store + 31) / 32);

    ggml_cuda_pool_alloc<uint32_t> bits(ctx.pool(), (size_t) ns * n_words);
    ggml_cuda_pool_alloc<int32_t>  rank0(ctx.pool(), (size_t) ns * n_words);
    ggml_cuda_pool_alloc<int32_t>  list(ctx.pool(), (size_t) ns * S);
    ggml_cuda_pool_alloc<int32_t>  n_staged(ctx.pool(), ns);
    page_stage_rank<<<ns, STAGE_THREADS, 0, ctx.stream()>>>(
        (const int32_t *) blocks->data, (const int32_t *) dst->src[1]->data, bits.get(), rank0.get(), list.get(),
        n_staged.get(), (int32_t *) dst->data, kb, n_q, n_words, S);
    CUDA_CHECK(cudaGetLastError());
    const dim3 grid(S, ns, stage_v ? 2 : 1);
    page_fetch<<<grid, 256, 0, ctx.stream()>>>(store, (char *) stage->data, store_v,
                                               stage_v ? (char *) stage_v->data : nullptr, list.get(), nullptr,
                                               n_staged.get(), stage->nb[1], stage->nb[2], S, n_store);
    CUDA_CHECK(cudaGetLastError());
}

bool pyqsa_cuda_qsa_page_stage_supported(const ggml_tensor * op) {
    for (int k = 0; k < (op->src[3] ? 2 : 1); ++k) {
        int64_t n_store = 0;
        if (!pyqsa_cuda_host_mapped(pyqsa_ggml_qsa_page_store(op, k, &n_store))) {
            return false;
        }
    }
    return op->src[0]->ne[2] <= 65535 && op->src[2]->ne[1] <= 65535;
}

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
    const dim3 grid(kb * n_q, ns, hot_v ? 2 : 1);
    page_fetch<<<grid, 256, 0, ctx.stream()>>>(store, (char *) hot->data, store_v,
                                               hot_v ? (char *) hot_v->data : nullptr, miss.get(), slot.get(),
                                               n_miss.get(), hot->nb[1], hot->nb[2], Hp, n_store);
    CUDA_CHECK(cudaGetLastError());
}

namespace {

// one CTA per (row, K or V): copies a row of the device cache to its row of the host store
__global__ void page_write(const char * k, const char * v, char * k_host, char * v_host, const int64_t * src_rows,
                           const int64_t * k_rows, const int64_t * v_rows, size_t B) {
    const long long dst_row = (blockIdx.y == 0 ? k_rows : v_rows)[blockIdx.x];
    if (dst_row < 0) {
        return;
    }
    const char * src = (blockIdx.y == 0 ? k : v) + (size_t) src_rows[blockIdx.x] * B;
    char *       dst = (blockIdx.y == 0 ? k_host : v_host) + (size_t) dst_row * B;
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

}  // namespace

void pyqsa_cuda_qsa_page_write(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * k = dst->src[0];
    const int64_t       n = ggml_nelements(dst->src[2]);
    if (n == 0) {
        return;
    }
    page_write<<<dim3((unsigned) n, 2), 128, 0, ctx.stream()>>>(
        (const char *) k->data, (const char *) dst->src[1]->data, (char *) pyqsa_ggml_host_ptr(dst, 2),
        (char *) pyqsa_ggml_host_ptr(dst, 4), (const int64_t *) dst->src[2]->data, (const int64_t *) dst->src[3]->data,
        (const int64_t *) dst->src[4]->data, k->nb[1]);
    CUDA_CHECK(cudaGetLastError());
}

bool pyqsa_cuda_qsa_page_write_supported(const ggml_tensor * op) {
    return pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 2)) && pyqsa_cuda_host_mapped(pyqsa_ggml_host_ptr(op, 4)) &&
           ggml_nelements(op->src[2]) <= INT32_MAX;
}

bool pyqsa_cuda_qsa_page_resolve_supported(const ggml_tensor * op) {
    // the kernel reads the stores in place: pinned (or device) memory only, never pageable
    for (int k = 0; k < (op->src[8] ? 2 : 1); ++k) {
        int64_t n_store = 0;
        if (!pyqsa_cuda_host_mapped(pyqsa_ggml_qsa_page_store(op, k, &n_store))) {
            return false;
        }
    }
    return op->src[7]->ne[1] <= PYQSA_PAGE_MAX_SLOTS && op->src[0]->ne[2] <= 65535;
}
