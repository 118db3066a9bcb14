// What a prefix-cache snapshot's head costs the engine thread at Flash-Next's shape: one slot's
// Gated DeltaNet state (36 layers: a conv state [3 x 8192] f32 and a recurrent state
// [128 x 128 x 32] f32 per layer, 79,036,416 bytes) out of [*, 8 slots] device tensors into a
// head buffer freshly grown as the writer grows one (malloc, huge-page advice), a copy a layer
// part as ggml_backend_tensor_get makes it (async on a stream, then a wait). Ways:
//   pageable:        straight into the head (what native/src/seq-state-io.h does now)
//   pinned stage:    into a pinned host buffer kept for it (the engine thread's part), and
//   ... its copy:    that buffer memcpy'd into the head (another thread's part)
//   device stage:    into a device buffer kept for it (the engine thread's part), and
//   ... its copy:    that buffer copied into the head (another thread's part)
// Each way's head is checked against the state's bytes before anything is timed; medians of 9.
#include "cuda-check.cuh"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int    n_layer = 36, n_slot = 8, slot = 5;
constexpr size_t conv_bytes = 3 * 8192 * 4, rec_bytes = 128 * 128 * 32 * 4;
constexpr size_t head_bytes = n_layer * (conv_bytes + rec_bytes);

struct part {
    const uint8_t * src;  // device
    size_t          size;
};

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint8_t * fresh_head() {  // as seq-state-io.h's writer::grow
    auto * p = static_cast<uint8_t *>(std::malloc(head_bytes));
    constexpr size_t huge = 2u << 20;
    const uintptr_t  a    = ((uintptr_t) p + huge - 1) & ~(uintptr_t) (huge - 1);
    const uintptr_t  b    = ((uintptr_t) p + head_bytes) & ~(uintptr_t) (huge - 1);
    madvise((void *) a, b - a, MADV_HUGEPAGE);
    return p;
}

void get(cudaStream_t s, void * dst, const void * src, size_t n) {  // ggml_backend_tensor_get
    CHECK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
}

void pageable(cudaStream_t s, const std::vector<part> & parts, uint8_t * head) {
    size_t at = 0;
    for (const part & p : parts) {
        get(s, head + at, p.src, p.size);
        at += p.size;
    }
}

void device(cudaStream_t s, const std::vector<part> & parts, uint8_t * dstage) {
    size_t at = 0;
    for (const part & p : parts) {
        CHECK_CUDA(cudaMemcpyAsync(dstage + at, p.src, p.size, cudaMemcpyDeviceToDevice, s));
        at += p.size;
    }
    CHECK_CUDA(cudaStreamSynchronize(s));
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main() {
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // the state tensors, [bytes, n_slot] per layer and kind, filled with a pattern of their offset
    std::vector<uint8_t *> conv(n_layer), rec(n_layer);
    std::vector<part>      parts;
    std::vector<uint8_t>   want;
    for (int il = 0; il < n_layer; ++il) {
        for (auto [t, n] : { std::pair{ &conv[il], conv_bytes }, std::pair{ &rec[il], rec_bytes } }) {
            CHECK_CUDA(cudaMalloc(t, n * n_slot));
            std::vector<uint8_t> h(n * n_slot);
            for (size_t i = 0; i < h.size(); ++i) {
                h[i] = (uint8_t) (i * 131 + il * 7 + (n == rec_bytes));
            }
            CHECK_CUDA(cudaMemcpy(*t, h.data(), h.size(), cudaMemcpyHostToDevice));
            parts.push_back({ *t + slot * n, n });
            want.insert(want.end(), h.begin() + slot * n, h.begin() + (slot + 1) * n);
        }
    }
    uint8_t *pstage, *dstage;
    CHECK_CUDA(cudaMallocHost(&pstage, head_bytes));
    CHECK_CUDA(cudaMalloc(&dstage, head_bytes));

    // a way: its name and the copy it times (into a fresh head, or a stage)
    struct way {
        const char * name;
        void (*run)(cudaStream_t, const std::vector<part> &, uint8_t *, uint8_t *, uint8_t *);
    };
    using parts_t   = std::vector<part>;
    const way ways[] = {
        { "pageable", [](cudaStream_t s, const parts_t & ps, uint8_t * h, uint8_t *, uint8_t *) { pageable(s, ps, h); } },
        { "pinned stage", [](cudaStream_t s, const parts_t & ps, uint8_t *, uint8_t * st,
                             uint8_t *) { pageable(s, ps, st); } },
        { "... its copy", [](cudaStream_t, const parts_t &, uint8_t * h, uint8_t * st,
                             uint8_t *) { std::memcpy(h, st, head_bytes); } },
        { "device stage", [](cudaStream_t s, const parts_t & ps, uint8_t *, uint8_t *, uint8_t * d) { device(s, ps, d); } },
        { "... its copy", [](cudaStream_t s, const parts_t &, uint8_t * h, uint8_t *, uint8_t * d) {
             get(s, h, d, head_bytes);
         } },
    };
    bool ok = true;
    for (const way & w : ways) {  // a stage's check is its copy's (which copies what the stage holds)
        uint8_t * head = fresh_head();
        w.run(s, parts, head, pstage, dstage);
        if (std::strstr(w.name, "stage") == nullptr) {
            const bool same = std::memcmp(head, want.data(), head_bytes) == 0;
            std::printf("check %-16s %s\n", w.name, same ? "OK" : "FAILED");
            ok = ok && same;
        }
        std::free(head);
    }
    if (!ok) {
        return 1;
    }
    std::printf("one slot's state: %zu bytes in %zu parts; ms, median of 9 (min-max), a fresh head each\n",
                head_bytes, parts.size());
    for (const way & w : ways) {
        std::vector<double> t;
        for (int r = 0; r < 9; ++r) {
            uint8_t *    head = fresh_head();
            const double t0   = now_ms();
            w.run(s, parts, head, pstage, dstage);
            t.push_back(now_ms() - t0);
            std::free(head);
        }
        std::printf("%-16s %8.2f (%.2f-%.2f)\n", w.name, median(t), *std::min_element(t.begin(), t.end()),
                    *std::max_element(t.begin(), t.end()));
    }
    return 0;
}
