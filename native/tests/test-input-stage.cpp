// The scheduler's input stage (native/ggml/input-stage.cpp) on a stand-in backend whose queued
// copies land only when it is waited for, as a GPU's do: what a split copies arrives as it was
// when copied (the caller may overwrite its inputs at once), the backend is waited for once a
// split and where the stage is full, and what the stage does not take is left to upstream's copy.
// On a machine with other backends, the same split through each of them; `perf` times a decode
// step's split there, staged and as upstream copies it.
//     test-input-stage [test|perf] [-b BACKEND]
#include "ggml-backend-impl.h"
#include "op-check.h"
#include "pyqsa-input-stage.h"

#include <functional>
#include <tuple>

namespace {

struct queue_ctx {
    std::vector<std::tuple<void *, const void *, size_t>> copies;  // (to, from, bytes), not yet made
    int                                                   waits = 0;
};

void queued_set(ggml_backend_t be, ggml_tensor * t, const void * data, size_t offset, size_t size) {
    static_cast<queue_ctx *>(be->context)->copies.emplace_back(static_cast<char *>(t->data) + offset, data, size);
}

void wait_queue(ggml_backend_t be) {
    auto * q = static_cast<queue_ctx *>(be->context);
    for (const auto & [to, from, n] : q->copies) std::memcpy(to, from, n);
    q->copies.clear();
    ++q->waits;
}

ggml_backend_buffer_type_t host_type(ggml_backend_dev_t) {
    return ggml_backend_cpu_buffer_type();
}

// a backend of the CPU's memory whose set_tensor_async is queued until synchronize
struct queued_backend {
    queue_ctx           q;
    ggml_backend_device dev{};
    ggml_backend        be{};
    queued_backend() {
        dev.iface.get_buffer_type      = host_type;
        dev.iface.get_host_buffer_type = host_type;
        be.iface.set_tensor_async      = queued_set;
        be.iface.synchronize           = wait_queue;
        be.device                      = &dev;
        be.context                     = &q;
    }
};

// f32 tensors of the given sizes in one buffer of `buft`
struct tensors {
    ggml_context *             ctx = nullptr;
    ggml_backend_buffer_t      buf = nullptr;
    std::vector<ggml_tensor *> t;
    tensors(const std::vector<int64_t> & sizes, ggml_backend_buffer_type_t buft) {
        ctx = ggml_init({ ggml_tensor_overhead() * (sizes.size() + 4), nullptr, true });
        for (int64_t n : sizes) t.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n));
        buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    }
    ~tensors() {
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }
};

std::vector<float> values(const ggml_tensor * t, float seed) {
    std::vector<float> v(ggml_nelements(t));
    for (size_t i = 0; i < v.size(); ++i) v[i] = seed + 0.25f * (float) (i % 1013);
    return v;
}

// copies srcs into dsts through a new stage on `be` as one split, overwrites the sources, waits:
// whether every dst holds what its src held when copied; `waits_inside`: be's waits the calls made
bool split_arrives(ggml_backend_t be, const std::vector<int64_t> & sizes, int * waits_inside = nullptr,
                   const std::function<int()> & waits = nullptr) {
    tensors src(sizes, ggml_backend_cpu_buffer_type()), dst(sizes, ggml_backend_get_default_buffer_type(be));
    pyqsa_input_stage * stage = nullptr;
    std::vector<std::vector<float>> sent;
    bool taken = true;
    const int before = waits ? waits() : 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        sent.push_back(values(src.t[i], (float) i));
        std::memcpy(src.t[i]->data, sent[i].data(), ggml_nbytes(src.t[i]));
        taken = pyqsa_input_stage_copy(&stage, be, src.t[i], dst.t[i], i == 0) && taken;
    }
    if (waits_inside) *waits_inside = waits() - before;
    for (ggml_tensor * t : src.t) std::memset(t->data, 0xff, ggml_nbytes(t));  // the caller's memory is free
    ggml_backend_synchronize(be);
    bool same = taken;
    for (size_t i = 0; i < sizes.size(); ++i) {
        std::vector<float> got(sent[i].size());
        ggml_backend_tensor_get(dst.t[i], got.data(), 0, ggml_nbytes(dst.t[i]));
        same = same && std::memcmp(got.data(), sent[i].data(), ggml_nbytes(dst.t[i])) == 0;
    }
    pyqsa_input_stage_free(stage);
    return same;
}

int run_tests(const char * only_backend) {
    int            n_ok = 0, n_fail = 0;
    const int64_t  MiB  = (1 << 20) / sizeof(float);  // f32 elements of 1 MiB
    queued_backend qb;
    ggml_backend_t be    = &qb.be;
    const auto     waits = [&] { return qb.q.waits; };
    int            inside = 0;

    bool ok = split_arrives(be, { 1000, 37, 4096 }, &inside, waits);
    report("a split's 3 inputs, overwritten once copied", "queued", "waits inside " + std::to_string(inside) + " ", ok && inside == 1,
           n_ok, n_fail);
    ok = split_arrives(be, { MiB, MiB, MiB, MiB, MiB }, &inside, waits);
    report("5 inputs of 1 MiB through a 4 MiB stage", "queued", "waits inside " + std::to_string(inside) + " ", ok && inside == 2,
           n_ok, n_fail);

    // what it leaves to upstream's copy: nothing queued, nothing waited for
    tensors             src({ MiB + 1, 64 }, ggml_backend_cpu_buffer_type()), dst({ MiB + 1, 64 }, ggml_backend_cpu_buffer_type());
    pyqsa_input_stage * stage = nullptr;
    const int           w0    = qb.q.waits;
    ggml_tensor *       rows  = ggml_view_2d(src.ctx, src.t[1], 8, 8, 8 * sizeof(float), 0);
    ggml_tensor *       cols  = ggml_transpose(src.ctx, rows);  // not contiguous
    ggml_tensor *       cdst  = ggml_view_2d(dst.ctx, dst.t[1], 8, 8, 8 * sizeof(float), 0);
    ggml_backend_view_init(rows);
    ggml_backend_view_init(cols);
    ggml_backend_view_init(cdst);
    ggml_backend_t cpu      = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    const bool     over     = pyqsa_input_stage_copy(&stage, be, src.t[0], dst.t[0], true);
    const bool     strided  = pyqsa_input_stage_copy(&stage, be, cols, cdst, true);
    const bool     no_queue = pyqsa_input_stage_copy(&stage, cpu, src.t[1], dst.t[1], true);
    report("an input over 1 MiB, a strided one, a backend without queued copies", "queued",
           "taken " + std::to_string(over) + std::to_string(strided) + std::to_string(no_queue) + " ",
           !over && !strided && !no_queue && qb.q.copies.empty() && qb.q.waits == w0 && stage == nullptr, n_ok, n_fail);
    ggml_backend_free(cpu);

    on_other_backends(only_backend, "a split's 3 inputs, overwritten once copied", n_ok, n_fail, [&](ggml_backend_t other) {
        return std::make_pair(split_arrives(other, { 1000, 37, 4096 }), std::string());
    });
    std::printf("%d/%d checks passed\n", n_ok, n_ok + n_fail);
    return n_fail == 0 ? 0 : 1;
}

// a decode step's split on each other backend: 40 host inputs of 8 to 4096 floats, us from the
// first copy until they are on the device, through the stage and as upstream copies them (a wait
// for the device and a synchronous set each)
int run_perf(const char * only_backend) {
    std::vector<int64_t> sizes;
    for (int i = 0; i < 40; ++i) sizes.push_back(8 << (i % 10));
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ||
            (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0)) {
            continue;
        }
        ggml_backend_t      be = ggml_backend_dev_init(dev, nullptr);
        tensors             src(sizes, ggml_backend_cpu_buffer_type()), dst(sizes, ggml_backend_get_default_buffer_type(be));
        pyqsa_input_stage * stage = nullptr;
        const auto          time  = [&](auto && split) {
            std::vector<double> us;
            for (int rep = -1; rep < 200; ++rep) {
                const auto t0 = std::chrono::steady_clock::now();
                split();
                ggml_backend_synchronize(be);
                if (rep >= 0) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            }
            std::sort(us.begin(), us.end());
            return us[us.size() / 2];
        };
        const double staged = time([&] {
            for (size_t j = 0; j < sizes.size(); ++j) pyqsa_input_stage_copy(&stage, be, src.t[j], dst.t[j], j == 0);
        });
        const double one_by_one = time([&] {
            for (size_t j = 0; j < sizes.size(); ++j) {
                ggml_backend_synchronize(be);
                ggml_backend_tensor_set(dst.t[j], src.t[j]->data, 0, ggml_nbytes(src.t[j]));
            }
        });
        std::printf("  a split of %zu host inputs %s: staged %.1f us, one at a time %.1f us (medians of 200)\n", sizes.size(),
                    ggml_backend_dev_name(dev), staged, one_by_one);
        pyqsa_input_stage_free(stage);
        ggml_backend_free(be);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return op_check_main(argc, argv, { { "test", run_tests }, { "perf", run_perf } });
}
