// pyqsa: the stage of a snapshot's head (pyqsa-seq-state.cpp): where a sequence's recurrent and
// conv states go on the thread that saves the head, for another thread to copy into the head
// (fill). ggml alone, so that native/tests/test-input-stage.cpp checks it on a stand-in backend.
#pragma once

#include "ggml-backend.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

namespace pyqsa_seq_state {

// whether reads of t can be queued on `queue`: t is in the buffers of queue's device
inline bool reads_on(const ggml_tensor * t, ggml_backend_t queue) {
    return t->buffer != nullptr &&
           ggml_backend_buffer_get_type(t->buffer) == ggml_backend_dev_buffer_type(ggml_backend_get_device(queue));
}

// A buffer of one sequence's states in the device's pinned host memory (host memory on a CPU
// device). Out of device memory, a straight copy into the head is pageable: a slot's ~80 MB at the
// full shape took the engine thread ~100 ms a snapshot while every slot waited; into pinned memory
// it is one copy at the bus's speed, and the memcpy into the head's fresh pages is the other
// thread's. With a queue (the backend of the states' device, which queues reads and records
// events), the reads are queued on its stream ahead of the passes that change the states and the
// save waits for none of them (each read made at once, as without a queue, is a copy and a wait:
// ~72 of them a head at the full shape), so the next heads' CPU work runs while they land; the
// next pass's first input copy (the scheduler's input stage) waits for the stream, reads included.
// fill waits for the event recorded after them. On the CPU, and for a tensor of another device,
// each read is made at once.
class stage {
public:
    stage(ggml_backend_buffer_t buf, ggml_backend_t queue = nullptr, ggml_backend_event_t done = nullptr) :
        buf(buf),
        queue(done != nullptr ? queue : nullptr),
        done(done) {}

    ~stage() {
        wait();
        ggml_backend_event_free(done);
        ggml_backend_buffer_free(buf);
    }

    stage(const stage &)             = delete;
    stage & operator=(const stage &) = delete;

    // size bytes of t from byte offset, for the head's bytes [at, at + size); false (nothing
    // copied) when the stage has no room left for them
    bool put(ggml_tensor * t, size_t offset, size_t size, size_t at) {
        uint8_t * p = claim(size, at);
        if (p == nullptr) {
            return false;
        }
        if (queues(t)) {
            ggml_backend_tensor_get_async(queue, t, p, offset, size);
            queued = true;
        } else {
            ggml_backend_tensor_get(t, p, offset, size);
        }
        return true;
    }

    // size bytes at src (host memory), for the head's bytes [at, at + size): copied into the
    // stage now; false (nothing copied) when it has no room left for them
    bool note(const void * src, size_t size, size_t at) {
        uint8_t * p = claim(size, at);
        if (p == nullptr) {
            return false;
        }
        std::memcpy(p, src, size);
        return true;
    }

    // on the saving thread, after its last put: the event the queued reads end at
    void close() {
        if (queued && !recorded) {
            ggml_backend_event_record(done, queue);
            recorded = true;
        }
    }

    // the staged bytes into the head they were put for, once they are here; the stage is empty
    // again
    void fill(uint8_t * head, size_t head_size) {
        wait();
        for (const part & p : parts) {
            if (p.at + p.size > head_size) {
                throw std::runtime_error("sequence state: not the head staged");
            }
            std::memcpy(head + p.at, base() + p.from, p.size);
        }
        clear();
    }

    // empty, with no read still landing in it
    void clear() {
        wait();
        parts.clear();
        used = 0;
    }

    bool empty() const { return parts.empty(); }

    // whether reads are queued since the last wait: their event (close) follows the passes before
    // them, so what waits for it (fill) sees those passes done
    bool has_queued() const { return queued; }

    // whether t's reads go on the queue: the buffers of its device, which its queued reads take
    bool queues(const ggml_tensor * t) const { return queue != nullptr && reads_on(t, queue); }

private:
    struct part {
        size_t from, at, size;  // the stage's bytes [from, from + size) are the head's [at, at + size)
    };

    uint8_t * base() { return static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf)); }

    // where the next size bytes of the stage go, kept for the head's bytes [at, at + size); nullptr
    // when it has no room left for them
    uint8_t * claim(size_t size, size_t at) {
        if (used + size > ggml_backend_buffer_get_size(buf)) {
            return nullptr;
        }
        parts.push_back({ used, at, size });
        used += size;
        return base() + used - size;
    }

    // the queued reads done (a save that failed before close: recorded here, on its thread)
    void wait() {
        if (!queued) {
            return;
        }
        close();
        ggml_backend_event_synchronize(done);
        queued = recorded = false;
    }

    ggml_backend_buffer_t buf;
    ggml_backend_t        queue;
    ggml_backend_event_t  done;
    std::vector<part>     parts;
    size_t                used     = 0;
    bool                  queued   = false;  // reads queued since the last wait
    bool                  recorded = false;  // and the event after them
};

// A save's reads of tensors into its head: through the stage (if any) while it has room, else
// at once. `settle` waits for the passes that wrote the tensors, called once, before the first
// read made at once: a read the stage queues follows them on their stream, so a save whose reads
// all queue waits for nothing (without a stage, the first read waits).
class head_reads {
public:
    head_reads(stage * staged, std::function<void()> settle) : staged(staged), settle(std::move(settle)) {}

    // size bytes of t from offset, for the head's bytes [at, at + size) at p
    void read(ggml_tensor * t, size_t offset, size_t size, uint8_t * p, size_t at) {
        if (staged == nullptr || !staged->queues(t)) {
            settled();
        }
        if (staged != nullptr && staged->put(t, offset, size, at)) {
            return;
        }
        settled();  // no room left in the stage
        ggml_backend_tensor_get(t, p, offset, size);
    }

    // size bytes at src for the head's bytes [at, at + size) through the stage, if any has room
    bool note(const void * src, size_t size, size_t at) { return staged != nullptr && staged->note(src, size, at); }

    // whether a read waited for the device
    bool waited() const { return is_settled; }

private:
    void settled() {
        if (!is_settled && settle) {
            settle();
        }
        is_settled = true;
    }

    stage *               staged;
    std::function<void()> settle;
    bool                  is_settled = false;
};

// Copies of saved rows on one thread (pyqsa_seq_rows_get): a device's rows are read on a stream of
// their own through two halves of a pinned buffer, each half copied to its destination while the
// other fills. Read at once into pageable memory, they are the driver's staged copies on the
// reading thread, a few ms each, which slowed the engine thread's own calls into CUDA: 8 x 32K
// decoding on an H100 while the prefix cache's copier read rows, 9.92 ms a step (launch 0.75 ms)
// read at once against 9.68 (0.57) through the reader, one call (ef4233e). Rows of another
// device are read at once.
class rows_reader {
public:
    // queue: a backend of the device with a stream of its own, which queues reads and records
    // events (the caller's, outliving the reader); buf: pinned host memory of that device, halved;
    // ev: two events of it (both owned)
    rows_reader(ggml_backend_t queue, ggml_backend_buffer_t buf, ggml_backend_event_t ev0, ggml_backend_event_t ev1) :
        queue(queue),
        buf(buf),
        ev{ ev0, ev1 } {}

    ~rows_reader() {
        finish();
        ggml_backend_event_free(ev[0]);
        ggml_backend_event_free(ev[1]);
        ggml_backend_buffer_free(buf);
    }

    rows_reader(const rows_reader &)             = delete;
    rows_reader & operator=(const rows_reader &) = delete;

    // size bytes of t from offset into dst (landed by finish at the latest)
    void read(ggml_tensor * t, size_t offset, size_t size, uint8_t * dst) {
        if (!reads_on(t, queue)) {
            ggml_backend_tensor_get(t, dst, offset, size);
            return;
        }
        const size_t half = ggml_backend_buffer_get_size(buf) / 2;
        for (size_t done = 0; done < size;) {
            const size_t len = std::min(half, size - done);
            const int    k   = next;
            next ^= 1;
            land(k);
            ggml_backend_tensor_get_async(queue, t, base(k), offset + done, len);
            ggml_backend_event_record(ev[k], queue);
            pending[k] = { dst + done, len };
            done += len;
        }
    }

    // every read made is in its destination
    void finish() {
        land(next);  // the older one
        land(next ^ 1);
    }

private:
    struct landing {
        uint8_t * dst  = nullptr;
        size_t    size = 0;
    };

    uint8_t * base(int k) {
        return static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf)) + k * (ggml_backend_buffer_get_size(buf) / 2);
    }

    void land(int k) {
        if (pending[k].dst == nullptr) {
            return;
        }
        ggml_backend_event_synchronize(ev[k]);
        std::memcpy(pending[k].dst, base(k), pending[k].size);
        pending[k] = {};
    }

    ggml_backend_t        queue;
    ggml_backend_buffer_t buf;
    ggml_backend_event_t  ev[2];
    landing               pending[2];
    int                   next = 0;
};

}  // namespace pyqsa_seq_state
