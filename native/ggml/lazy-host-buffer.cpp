// The lazily committed host buffer type (see native/include/pyqsa-lazy-host.h).
#include "pyqsa-lazy-host.h"

#include "ggml-backend-impl.h"

#if defined(__linux__)

#    include <sys/mman.h>
#    include <unistd.h>

#    include <algorithm>
#    include <cstring>
#    include <mutex>
#    include <set>
#    include <vector>

namespace {

struct lazy_buffer {
    void * base;
    size_t size;  // whole pages
};

std::mutex               live_mutex;
std::set<lazy_buffer *>  live;  // for pyqsa_lazy_host_held

lazy_buffer * ctx_of(ggml_backend_buffer_t buffer) {
    return static_cast<lazy_buffer *>(buffer->context);
}

void free_buffer(ggml_backend_buffer_t buffer) {
    lazy_buffer * b = ctx_of(buffer);
    {
        std::lock_guard<std::mutex> lock(live_mutex);
        live.erase(b);
    }
    munmap(b->base, b->size);
    delete b;
}

void * get_base(ggml_backend_buffer_t buffer) {
    return ctx_of(buffer)->base;
}

void memset_tensor(ggml_backend_buffer_t, ggml_tensor * tensor, uint8_t value, size_t offset, size_t size) {
    std::memset((char *) tensor->data + offset, value, size);
}

void set_tensor(ggml_backend_buffer_t, ggml_tensor * tensor, const void * data, size_t offset, size_t size) {
    std::memcpy((char *) tensor->data + offset, data, size);
}

void get_tensor(ggml_backend_buffer_t, const ggml_tensor * tensor, void * data, size_t offset, size_t size) {
    std::memcpy(data, (const char *) tensor->data + offset, size);
}

bool cpy_tensor(ggml_backend_buffer_t, const ggml_tensor * src, ggml_tensor * dst) {
    if (!ggml_backend_buffer_is_host(src->buffer)) {
        return false;
    }
    std::memcpy(dst->data, src->data, ggml_nbytes(src));
    return true;
}

// zero: the pages go back to the OS (a private anonymous page reads as zero afterwards), so the
// clear every new cache gets commits nothing
void clear(ggml_backend_buffer_t buffer, uint8_t value) {
    lazy_buffer * b = ctx_of(buffer);
    if (value != 0 || madvise(b->base, b->size, MADV_DONTNEED) != 0) {
        std::memset(b->base, value, b->size);
    }
}

const ggml_backend_buffer_i buffer_iface = {
    /* .free_buffer   = */ free_buffer,
    /* .get_base      = */ get_base,
    /* .init_tensor   = */ nullptr,
    /* .memset_tensor = */ memset_tensor,
    /* .set_tensor    = */ set_tensor,
    /* .get_tensor    = */ get_tensor,
    /* .set_tensor_2d = */ nullptr,
    /* .get_tensor_2d = */ nullptr,
    /* .cpy_tensor    = */ cpy_tensor,
    /* .clear         = */ clear,
    /* .reset         = */ nullptr,
};

const char * buft_name(ggml_backend_buffer_type_t) {
    return "PYQSA_LazyHost";
}

ggml_backend_buffer_t alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    const size_t page = (size_t) sysconf(_SC_PAGESIZE);
    size              = (std::max<size_t>(size, 1) + page - 1) / page * page;
    void * base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        return nullptr;
    }
    auto * b = new lazy_buffer{ base, size };
    {
        std::lock_guard<std::mutex> lock(live_mutex);
        live.insert(b);
    }
    return ggml_backend_buffer_init(buft, buffer_iface, b, size);
}

size_t get_alignment(ggml_backend_buffer_type_t) {
    return 64;
}

bool is_host(ggml_backend_buffer_type_t) {
    return true;
}

}  // namespace

ggml_backend_buffer_type_t pyqsa_lazy_host_buffer_type(void) {
    static ggml_backend_buffer_type buft = {
        /* .iface   = */ {
            /* .get_name       = */ buft_name,
            /* .alloc_buffer   = */ alloc_buffer,
            /* .get_alignment  = */ get_alignment,
            /* .get_max_size   = */ nullptr,
            /* .get_alloc_size = */ nullptr,
            /* .is_host        = */ is_host,
        },
        /* .device  = */ nullptr,  // as ggml's CPU buffer type
        /* .context = */ nullptr,
    };
    return &buft;
}

size_t pyqsa_lazy_host_held(ggml_backend_buffer_type_t buft, size_t size) {
    if (buft != pyqsa_lazy_host_buffer_type()) {
        return size;
    }
    const size_t                page = (size_t) sysconf(_SC_PAGESIZE);
    std::lock_guard<std::mutex> lock(live_mutex);
    size_t                      resident = 0;
    std::vector<unsigned char>  in_core;
    for (const lazy_buffer * b : live) {
        in_core.resize(b->size / page);
        if (mincore(b->base, b->size, in_core.data()) != 0) {
            resident += b->size;  // unknown: count it all
            continue;
        }
        for (unsigned char c : in_core) {
            resident += (c & 1) ? page : 0;
        }
    }
    return resident;
}

#else

ggml_backend_buffer_type_t pyqsa_lazy_host_buffer_type(void) {
    return ggml_backend_cpu_buffer_type();
}

size_t pyqsa_lazy_host_held(ggml_backend_buffer_type_t, size_t size) {
    return size;
}

#endif
