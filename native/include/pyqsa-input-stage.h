// The graph scheduler's copies of host inputs to a device (exported from ggml-base), queued on the
// device's stream instead of made one at a time.
//
// Upstream's ggml_backend_sched copies each input of a split that lives in host memory (the
// user's inputs: positions, masks, row ids, a decode step's 40-odd tensors; a CPU split's output)
// with a synchronous set: a wait for the device, a copy, and a wait for the copy, per tensor. A
// stage takes the split's host inputs into pinned memory it owns and queues their copies on the
// split's stream, ahead of its graph: one wait a split (for the stage's last copies to be read)
// instead of two a tensor. The caller's memory is free once the call returns, as with the
// synchronous set. PYQSA_SCHED_INPUTS_SYNC=1 turns it off (upstream's copies).
#pragma once

#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pyqsa_input_stage pyqsa_input_stage;

// Queues the copy of src (in host memory) into dst (in backend's memory) on backend's stream
// through *stage (made on first use); `first`: the split's first staged input, before which the
// backend is waited for. False, with nothing done, where the copy is not one it takes: a backend
// without queued copies, a source not in host memory or not contiguous, a destination not in
// the backend's own buffer type, a tensor over the size staged, or the switch set.
GGML_API bool pyqsa_input_stage_copy(pyqsa_input_stage ** stage, ggml_backend_t backend, const struct ggml_tensor * src,
                                     struct ggml_tensor * dst, bool first);

GGML_API void pyqsa_input_stage_free(pyqsa_input_stage * stage);

#ifdef __cplusplus
}
#endif
