// A host buffer type whose memory is reserved, not committed (exported from ggml-base): the OS
// backs a page only when it is first written, and clearing a buffer to zero gives its pages back.
// For a cache that nothing reads, which then costs only what is copied into it: the indexer cache
// of a paging context (its pager keeps the block keys itself; see native/src/qsa-pager.h). Linux
// only; elsewhere the CPU buffer type.
#pragma once

#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

GGML_API ggml_backend_buffer_type_t pyqsa_lazy_host_buffer_type(void);

// The bytes a memory breakdown entry (buffer type, allocated size) holds: for the lazy type, the
// pages of its live buffers that are in memory now (ever written and not given back), over every
// context; for any other type, size.
GGML_API size_t pyqsa_lazy_host_held(ggml_backend_buffer_type_t buft, size_t size);

#ifdef __cplusplus
}
#endif
