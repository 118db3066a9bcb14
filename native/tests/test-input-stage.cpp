// The scheduler's input stage (native/ggml/input-stage.cpp) on a stand-in backend whose queued
// copies land only when it is waited for, as a GPU's do: what a split copies arrives as it was
// when copied (the caller may overwrite its inputs at once), the backend is waited for once a
// split and where the stage is full, and what the stage does not take is left to upstream's copy.
// On a machine with other backends, the same split through each of them; `perf` times a decode
// step's split there, staged and as upstream copies it. Then the stage of a snapshot's head
// (native/src/seq-stage.h) on the same stand-in: its reads of the states are queued ahead of the
// next pass's writes and the saving thread waits for none; the head gets the states as the save
// found them; a save's reads (head_reads) wait for the device once, before the first read the
// stage does not queue, and not at all when it queues every one; rows read through a
// rows_reader's two halves land whole.
//     test-input-stage [test|perf] [-b BACKEND]
#include "ggml-backend-impl.h"
#include "op-check.h"
#include "pyqsa-input-stage.h"
#include "seq-stage.h"

#include <functional>
#include <memory>
#include <tuple>

namespace {

struct queue_ctx {
    std::vector<std::tuple<void *, const void *, size_t>> copies;  // (to, from, bytes), not yet made
    int                                                   waits = 0;
};

void queued_set(ggml_backend_t be, ggml_tensor * t, const void * data, size_t offset, size_t size) {
    static_cast<queue_ctx *>(be->context)->copies.emplace_back(static_cast<char *>(t->data) + offset, data, size);
}

void queued_get(ggml_backend_t be, const ggml_tensor * t, void * data, size_t offset, size_t size) {
    static_cast<queue_ctx *>(be->context)->copies.emplace_back(data, static_cast<const char *>(t->data) + offset, size);
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

// an event of the stand-in: recorded, it waits for the whole queue (what came before it and after)
ggml_backend_event_t new_event(ggml_backend_dev_t dev) {
    return new ggml_backend_event{ dev, nullptr };
}

void free_event(ggml_backend_dev_t, ggml_backend_event_t e) {
    delete e;
}

void record_event(ggml_backend_t be, ggml_backend_event_t e) {
    e->context = be;
}

void wait_event(ggml_backend_dev_t, ggml_backend_event_t e) {
    if (e->context != nullptr) wait_queue(static_cast<ggml_backend_t>(e->context));
}

// a backend of the CPU's memory whose set_tensor_async and get_tensor_async are queued until
// synchronize (or an event recorded after them is waited for)
struct queued_backend {
    queue_ctx           q;
    ggml_backend_device dev{};
    ggml_backend        be{};
    queued_backend() {
        dev.iface.get_buffer_type      = host_type;
        dev.iface.get_host_buffer_type = host_type;
        dev.iface.event_new            = new_event;
        dev.iface.event_free           = free_event;
        dev.iface.event_synchronize    = wait_event;
        be.iface.set_tensor_async      = queued_set;
        be.iface.get_tensor_async      = queued_get;
        be.iface.synchronize           = wait_queue;
        be.iface.event_record          = record_event;
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

// a snapshot's head staged from two states of `be`'s memory (a conv state and a recurrent one, as a
// save puts them; `be` null: the CPU's), the next pass then writing both on `be`'s stream, the head
// filled: whether it holds the states as the save found them. `queued`: the stage queues its
// reads on `be` (else reads each at once); `q`, the stand-in's queue: its waits during the save
// and the reads the save left queued, in `in_save`.
bool head_gets_the_saved_states(ggml_backend_t be, bool queued, queue_ctx * q = nullptr,
                                std::pair<int, size_t> * in_save = nullptr) {
    using pyqsa_seq_state::stage;
    ggml_backend_dev_t         dev   = be ? ggml_backend_get_device(be) : nullptr;
    ggml_backend_buffer_type_t pin   = dev ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
    tensors                    states({ 3000, 5000 }, be ? ggml_backend_get_default_buffer_type(be) : ggml_backend_cpu_buffer_type());
    std::vector<float>         saved[2] = { values(states.t[0], 1.0f), values(states.t[1], 2.0f) };
    std::vector<float>         next[2]  = { values(states.t[0], -7.0f), values(states.t[1], -9.0f) };
    for (int i = 0; i < 2; ++i) ggml_backend_tensor_set(states.t[i], saved[i].data(), 0, ggml_nbytes(states.t[i]));
    const size_t n0 = ggml_nbytes(states.t[0]), n1 = ggml_nbytes(states.t[1]);
    stage        staged(ggml_backend_buft_alloc_buffer(pin ? pin : ggml_backend_cpu_buffer_type(), n0 + n1),
                        queued ? be : nullptr, queued ? ggml_backend_event_new(dev) : nullptr);
    std::vector<uint8_t> head(16 + n0 + n1, 0);  // the states' bytes in the head after 16 of its own
    const int            before = q ? q->waits : 0;
    bool ok = staged.put(states.t[0], 0, n0, 16) && staged.put(states.t[1], 0, n1, 16 + n0) && !staged.put(states.t[0], 0, 4, 0);
    staged.close();
    if (in_save) *in_save = { q->waits - before, q->copies.size() };
    for (int i = 0; i < 2; ++i) {  // the next pass, after the reads on the stream
        if (be) {
            ggml_backend_tensor_set_async(be, states.t[i], next[i].data(), 0, ggml_nbytes(states.t[i]));
        } else {
            ggml_backend_tensor_set(states.t[i], next[i].data(), 0, ggml_nbytes(states.t[i]));
        }
    }
    staged.fill(head.data(), head.size());
    ok = ok && staged.empty() && std::memcmp(head.data() + 16, saved[0].data(), n0) == 0 &&
         std::memcmp(head.data() + 16 + n0, saved[1].data(), n1) == 0;
    if (be) ggml_backend_synchronize(be);
    for (int i = 0; i < 2; ++i) {
        std::vector<float> now(next[i].size());
        ggml_backend_tensor_get(states.t[i], now.data(), 0, ggml_nbytes(states.t[i]));
        ok = ok && std::memcmp(now.data(), next[i].data(), ggml_nbytes(states.t[i])) == 0;
    }
    return ok;
}

// a save's two reads through head_reads (seq-stage.h) on the stand-in, with a stage that has room
// for `room` of the two states (0: no stage), the next pass queued after the save, the head filled:
// whether it holds the states as the save found them; `settles`: the save's waits for the device
bool head_reads_the_saved_states(queued_backend & qb, int room, int & settles) {
    using namespace pyqsa_seq_state;
    tensors            states({ 3000, 5000 }, ggml_backend_cpu_buffer_type());
    std::vector<float> saved[2] = { values(states.t[0], 4.0f), values(states.t[1], 5.0f) };
    std::vector<float> next[2]  = { values(states.t[0], -3.0f), values(states.t[1], -6.0f) };
    for (int i = 0; i < 2; ++i) std::memcpy(states.t[i]->data, saved[i].data(), ggml_nbytes(states.t[i]));
    const size_t           n0 = ggml_nbytes(states.t[0]), n1 = ggml_nbytes(states.t[1]);
    std::unique_ptr<stage> staged;
    if (room > 0) {
        staged = std::make_unique<stage>(ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), room == 2 ? n0 + n1 : n0),
                                         &qb.be, ggml_backend_event_new(&qb.dev));
    }
    std::vector<uint8_t> head(16 + n0 + n1, 0);
    settles = 0;
    head_reads reads(staged.get(), [&] {
        ++settles;
        ggml_backend_synchronize(&qb.be);
    });
    reads.read(states.t[0], 0, n0, head.data() + 16, 16);
    reads.read(states.t[1], 0, n1, head.data() + 16 + n0, 16 + n0);
    if (staged) staged->close();
    for (int i = 0; i < 2; ++i) ggml_backend_tensor_set_async(&qb.be, states.t[i], next[i].data(), 0, ggml_nbytes(states.t[i]));
    if (staged) staged->fill(head.data(), head.size());
    ggml_backend_synchronize(&qb.be);
    return reads.waited() == (settles > 0) && std::memcmp(head.data() + 16, saved[0].data(), n0) == 0 &&
           std::memcmp(head.data() + 16 + n0, saved[1].data(), n1) == 0;
}

// rows read through a rows_reader (seq-stage.h) whose halves hold 4096 bytes: a whole tensor and a
// range of another, each over several halves; whether every byte landed once finished, and how
// often the reader waited for the stand-in's queue
bool rows_read_through_halves(queued_backend & qb, int & waits) {
    using namespace pyqsa_seq_state;
    tensors            rows({ 3000, 5000 }, ggml_backend_cpu_buffer_type());
    std::vector<float> want[2] = { values(rows.t[0], 6.0f), values(rows.t[1], 7.0f) };
    for (int i = 0; i < 2; ++i) std::memcpy(rows.t[i]->data, want[i].data(), ggml_nbytes(rows.t[i]));
    const size_t         n0 = ggml_nbytes(rows.t[0]), from = 400, n1 = 8000;
    std::vector<uint8_t> got(n0 + n1, 0);
    const int            before = qb.q.waits;
    {
        rows_reader reader(&qb.be, ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), 2 * 4096),
                           ggml_backend_event_new(&qb.dev), ggml_backend_event_new(&qb.dev));
        reader.read(rows.t[0], 0, n0, got.data());
        reader.read(rows.t[1], from, n1, got.data() + n0);
        reader.finish();
        waits = qb.q.waits - before;
    }
    return std::memcmp(got.data(), want[0].data(), n0) == 0 &&
           std::memcmp(got.data() + n0, reinterpret_cast<const uint8_t *>(want[1].data()) + from, n1) == 0;
}

void head_stage_checks(const char * only_backend, int & n_ok, int & n_fail) {
    queued_backend         qb;
    std::pair<int, size_t> save;
    const bool             ok = head_gets_the_saved_states(&qb.be, true, &qb.q, &save);
    report("a snapshot head's states, the next pass queued after the save", "queued",
           "waits in the save " + std::to_string(save.first) + ", reads queued " + std::to_string(save.second) + " ",
           ok && save.first == 0 && save.second == 2, n_ok, n_fail);
    report("the same read at once (no queue)", "CPU", "", head_gets_the_saved_states(nullptr, false), n_ok, n_fail);
    const char * reads_of[] = { "a save's reads without a stage", "a save's reads, the stage full after the first",
                                "a save's reads, all queued" };
    const int    settles_of[] = { 1, 1, 0 };  // a wait before the first read made at once, none when all queue
    for (int room = 0; room <= 2; ++room) {
        int        settles = -1;
        const bool same    = head_reads_the_saved_states(qb, room, settles);
        report(reads_of[room], "queued", "waits for the device " + std::to_string(settles) + " ",
               same && settles == settles_of[room], n_ok, n_fail);
    }

    int        reader_waits = 0;
    const bool rows_same    = rows_read_through_halves(qb, reader_waits);
    report("rows of 12000 and 8000 bytes through two halves of 4096", "queued",
           "waits " + std::to_string(reader_waits) + " ", rows_same && reader_waits == 5, n_ok, n_fail);  // a wait a half filled

    // a save that failed before its close: clearing the stage waits for what it queued
    tensors            state({ 256 }, ggml_backend_cpu_buffer_type());
    std::vector<float> saved = values(state.t[0], 3.0f);
    std::memcpy(state.t[0]->data, saved.data(), ggml_nbytes(state.t[0]));
    pyqsa_seq_state::stage staged(ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), ggml_nbytes(state.t[0])),
                                  &qb.be, ggml_backend_event_new(&qb.dev));
    const bool put     = staged.put(state.t[0], 0, ggml_nbytes(state.t[0]), 0);
    const bool pending = !qb.q.copies.empty();
    staged.clear();
    report("a stage cleared after a failed save", "queued",
           "pending " + std::to_string(pending) + ", after clear " + std::to_string(qb.q.copies.size()) + " ",
           put && pending && qb.q.copies.empty() && staged.empty(), n_ok, n_fail);

    // a head's own small bytes through the stage between queued reads (writer::stage_writes):
    // each lands where it was noted once filled, and a stage with no room left refuses them
    {
        pyqsa_seq_state::stage mixed(ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(),
                                                                    ggml_nbytes(state.t[0]) + 12),
                                     &qb.be, ggml_backend_event_new(&qb.dev));
        const uint32_t         type = 7;
        const uint64_t         size = ggml_nbytes(state.t[0]);
        const size_t           half = size / 2;
        std::vector<uint8_t>   head(4 + half + 8 + (size - half), 0xee);
        const bool             noted = mixed.note(&type, 4, 0) && mixed.put(state.t[0], 0, half, 4) &&
                           mixed.note(&size, 8, 4 + half) && mixed.put(state.t[0], half, size - half, 12 + half);
        const bool full = !mixed.note(&type, 1, head.size());
        mixed.close();
        mixed.fill(head.data(), head.size());
        const auto * bytes = reinterpret_cast<const uint8_t *>(saved.data());
        const bool   same  = std::memcmp(head.data(), &type, 4) == 0 && std::memcmp(head.data() + 4, bytes, half) == 0 &&
                          std::memcmp(head.data() + 4 + half, &size, 8) == 0 &&
                          std::memcmp(head.data() + 12 + half, bytes + half, size - half) == 0;
        report("a head's own bytes noted between queued reads", "queued", "", noted && full && same && mixed.empty(), n_ok,
               n_fail);
    }

    // a device's own stream, where the device queues reads and records events (as the save asks)
    on_other_backends(only_backend, "a snapshot head's states, the next pass queued after the save", n_ok, n_fail,
                      [&](ggml_backend_t other) {
                          ggml_backend_dev_props props = {};
                          ggml_backend_dev_get_props(ggml_backend_get_device(other), &props);
                          const bool queued = props.caps.async && props.caps.events;
                          return std::make_pair(head_gets_the_saved_states(other, queued),
                                                std::string(queued ? "queued " : "read at once "));
                      });
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
    head_stage_checks(only_backend, n_ok, n_fail);
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
