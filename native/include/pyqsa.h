// pyqsa C API, exported from the patched libllama.
//
// Return codes: every function returning int32_t returns one of PYQSA_OK or a negative
// PYQSA_ERR_* listed here; the comment of each function says which it can return.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#    define PYQSA_API __declspec(dllexport)
#else
#    define PYQSA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

// cffi-begin: the declarations up to cffi-end are read by pyqsa/native.py (plain C only).

#define PYQSA_OK                 0
#define PYQSA_ERR_INVALID_ARG   -1
#define PYQSA_ERR_OUT_OF_RANGE  -2
#define PYQSA_ERR_UNSUPPORTED   -3
#define PYQSA_ERR_OUT_OF_MEMORY -4

typedef struct pyqsa_build_info {
    const char * version;          // pyqsa version, e.g. "0.1.0"
    const char * upstream_commit;  // pinned llama.cpp commit, e.g. "0c1e570"
    int32_t      has_cuda;         // 1 when the CUDA backend is compiled in
    const char * cuda_archs;       // CMAKE_CUDA_ARCHITECTURES of the build, "" without CUDA
} pyqsa_build_info;

typedef struct pyqsa_device_info {
    char     name[128];         // backend device name, e.g. "CUDA0", "CPU"
    char     description[256];  // e.g. "NVIDIA H200" or the CPU model
    int32_t  type;              // 0 CPU, 1 GPU, 2 integrated GPU, 3 accelerator
    uint64_t memory_free;       // bytes
    uint64_t memory_total;      // bytes
} pyqsa_device_info;

// "pyqsa <version> (llama.cpp <commit>)". Never NULL; static storage.
PYQSA_API const char * pyqsa_version(void);

// Fills *out. Returns PYQSA_OK, or PYQSA_ERR_INVALID_ARG when out is NULL.
PYQSA_API int32_t pyqsa_build_info_get(pyqsa_build_info * out);

// Number of ggml backend devices this library sees (loads backends on first call).
PYQSA_API int32_t pyqsa_device_count(void);

// Fills *out for device i. Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG when out is NULL,
// or PYQSA_ERR_OUT_OF_RANGE when i is not in [0, pyqsa_device_count()).
PYQSA_API int32_t pyqsa_device_info_get(int32_t i, pyqsa_device_info * out);

// How the CUDA backend has run graphs since the process started (every context's):
// out[0] kernel by kernel (CUDA graphs off, warming up, or the graph changed), out[1] captured
// into a CUDA graph, out[2] replays of a captured graph. Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG
// when out is NULL, or PYQSA_ERR_UNSUPPORTED without a CUDA backend.
PYQSA_API int32_t pyqsa_cuda_graph_counts_get(uint64_t out[3]);

// The CUDA driver keeps, per device, a stack for every thread the device can run at once, as
// large as the largest frame of any kernel launched so far, and grows it for good, mid-run, at
// the first launch that needs more. Raises CUDA device `device`'s per-thread stack to at least
// min_per_thread bytes now (0: leaves it) and counts its stacks in the ledger (pyqsa_ledger's
// stack) from then on. Returns PYQSA_OK, PYQSA_ERR_OUT_OF_RANGE for a device the CUDA backend
// lacks, or PYQSA_ERR_UNSUPPORTED without a CUDA backend.
PYQSA_API int32_t pyqsa_cuda_stack_reserve(int32_t device, uint64_t min_per_thread);

// Debug view of a ggml tensor seen by llama's cb_eval callback (llama_context_params.cb_eval):
// lets tests and calibration read named intermediates (e.g. "indexer_sel-3", "Kcur-3").
typedef struct pyqsa_tensor_view {
    char    name[64];  // ggml tensor name
    int32_t type;      // enum ggml_type
    int64_t ne[4];     // elements per dimension, ne[0] fastest
} pyqsa_tensor_view;

// Fills *out from tensor t (a struct ggml_tensor *). Returns PYQSA_OK, or
// PYQSA_ERR_INVALID_ARG when t or out is NULL.
PYQSA_API int32_t pyqsa_tensor_view_get(const void * t, pyqsa_tensor_view * out);

// Copies tensor t (F32, F16, BF16 or I32; any backend) into dst as float, n = ggml_nelements(t)
// values in ggml row-major order. Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG when t or dst is NULL
// or t is not contiguous, PYQSA_ERR_OUT_OF_RANGE when n is smaller than the element count,
// PYQSA_ERR_UNSUPPORTED for other types.
PYQSA_API int32_t pyqsa_tensor_read_f32(const void * t, float * dst, int64_t n);

// Importance matrix (llama-imatrix's statistics, for quantizing with an imatrix): a collector
// given to a context as its eval callback (llama_context_params.cb_eval = pyqsa_imatrix_collect,
// cb_eval_user_data = the collector) accumulates, for every MUL_MAT of a "blk." weight whose input
// has 16 rows or more (shorter ones are decode steps, skipped as llama-imatrix does) and every
// MUL_MAT_ID, the sum over the input's rows of each column's square, per weight matrix, and the
// number of rows; a MUL_MAT_ID keeps a sum row and a count per expert, over the tokens routed to
// it. Entries are named by the weight ("blk.0.ffn_down_exps.weight") and ordered by name.
// Free the collector with pyqsa_imatrix_free once no context uses it. NULL when out of memory.
PYQSA_API void * pyqsa_imatrix_new(void);
PYQSA_API void   pyqsa_imatrix_free(void * im);

// The eval callback (a ggml_backend_sched_eval_callback; t: struct ggml_tensor *, im: the
// collector). After an error (non-finite activations, a weight seen with two shapes) it collects
// nothing more: pyqsa_imatrix_error says what went wrong.
PYQSA_API bool pyqsa_imatrix_collect(void * t, bool ask, void * im);

// The number of entries, or PYQSA_ERR_INVALID_ARG for a NULL collector.
PYQSA_API int32_t pyqsa_imatrix_n_entries(const void * im);

// Entry i's weight name (into name, cut to cap), its columns, matrices (experts) and counts
// (n_mat for a MUL_MAT_ID, 1 for a dense weight). Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG for a
// NULL argument or cap 0, PYQSA_ERR_OUT_OF_RANGE when i is not an entry.
PYQSA_API int32_t pyqsa_imatrix_entry(const void * im, int32_t i, char * name, size_t cap,
                                      int64_t * n_cols, int64_t * n_mat, int64_t * n_counts);

// Copies entry i's sums (n_mat x n_cols floats, matrix-major) and counts (n_counts values).
// Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG for a NULL argument, PYQSA_ERR_OUT_OF_RANGE when i is not
// an entry.
PYQSA_API int32_t pyqsa_imatrix_read(const void * im, int32_t i, float * sums, int64_t * counts);

// The collector's first error into buf (NUL-terminated, cut to cap); returns its length, 0 when
// there was none, PYQSA_ERR_INVALID_ARG for a NULL argument or cap 0.
PYQSA_API int32_t pyqsa_imatrix_error(const void * im, char * buf, size_t cap);

// How the indexed (QSA) layers attend; a setting of each context.
#define PYQSA_QSA_POSITIONAL 0  // block keys kept incrementally; O(n_tokens) inputs (default)
#define PYQSA_QSA_SPARSE     1  // upstream's per-step pooling -> selection mask -> sparse attention
#define PYQSA_QSA_MASKED     2  // upstream's dense attention under the selection mask

// pyqsa's settings of one llama context, fixed when the context is created.
typedef struct pyqsa_context_config {
    int32_t qsa_mode;    // PYQSA_QSA_*; positional and sparse need flash attention on (V in rows),
                         // without it the layers fall back to masked
    int32_t hot_blocks;  // 0: the indexed layers' K/V live on the device. > 0: host-backed
                         // paging (positional mode only): the K/V in pinned host memory, a hot
                         // cache of this many blocks per stream and layer on the device, at
                         // least the blocks one query selects (indexer_top_k / ratio)
    int32_t hot_type;    // paging: the ggml type of the device hot cache and ring; -1 (the
                         // default): the K/V cache's own. 1 (f16) with a q8_0 cache: the host
                         // store stays q8_0 (half the bytes over the host link) and each fetched
                         // block is dequantized into f16, so decode attention runs on f16
} pyqsa_context_config;

// The settings a context gets when none are given (llama_init_from_model called directly).
PYQSA_API pyqsa_context_config pyqsa_context_config_default(void);

// llama_init_from_model with pyqsa's settings.
//   model:  struct llama_model *
//   params: const struct llama_context_params * (from any binding of the pinned llama.h)
// Returns the struct llama_context *, or NULL with *err set: PYQSA_ERR_INVALID_ARG for a NULL
// argument or an unknown setting (paging outside positional mode, a negative hot_blocks), PYQSA_ERR_UNSUPPORTED when llama.cpp could not create the
// context (its log says why).
PYQSA_API void * pyqsa_init_from_model(void * model, const void * params,
                                       const pyqsa_context_config * cfg, int32_t * err);

// Fills *out with the settings of ctx (a struct llama_context *). Returns PYQSA_OK, or
// PYQSA_ERR_INVALID_ARG when ctx or out is NULL.
PYQSA_API int32_t pyqsa_context_config_get(const void * ctx, pyqsa_context_config * out);

// Bytes a context holds, by category, in one kind of memory (device or host).
typedef struct pyqsa_ledger {
    uint64_t weights;    // model tensors
    uint64_t kv;         // K/V cache of the indexed (QSA) attention layers
    uint64_t indexer;    // indexer key cache (raw keys of the tail, block keys)
    uint64_t recurrent;  // Gated DeltaNet (recurrent) state of every sequence
    uint64_t compute;    // compute buffers of the graph scheduler
    uint64_t hot;        // paging: hot caches and page state of the indexed layers
    uint64_t staging;    // paging: block slots past the hot ones, used only by prefill staging
    uint64_t tail;       // paging: rings of the newest positions, written before the host store
    uint64_t pool;       // ggml's CUDA memory pools: kernels' temporaries, held from their largest
                         // use on (the process's, every context's; device only)
    uint64_t stack;      // the CUDA driver's thread stacks of the devices pyqsa_cuda_stack_reserve
                         // named, beyond what they held then (part of the CUDA context): the
                         // per-thread growth x the threads a device holds at once (the process's;
                         // device only)
} pyqsa_ledger;

// Fills *device with the bytes ctx (a struct llama_context *) holds in device buffers and
// *host with those in host buffers (the CPU backend's included). Returns PYQSA_OK, or
// PYQSA_ERR_INVALID_ARG when an argument is NULL.
PYQSA_API int32_t pyqsa_ledger_get(const void * ctx, pyqsa_ledger * device, pyqsa_ledger * host);

// Paging counters of a context since it was created, over every indexed layer and stream.
typedef struct pyqsa_paging_stats {
    uint64_t hits;             // selected blocks found in the hot cache
    uint64_t misses;           // blocks fetched from the host store into the hot cache
    uint64_t staged;           // blocks staged from the host store for prefill chunks
    uint64_t bytes_to_device;  // K/V bytes of those fetches and stagings
    uint64_t bytes_to_host;    // K/V bytes written to the host store
    int64_t  hot_blocks;       // the hot cache's blocks per stream and layer
} pyqsa_paging_stats;

// Fills *out for ctx (a struct llama_context *); waits for the device to read its counters.
// Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG for a NULL argument, or PYQSA_ERR_UNSUPPORTED when
// the context does not page (hot_blocks 0).
PYQSA_API int32_t pyqsa_paging_stats_get(const void * ctx, pyqsa_paging_stats * out);

// The i-th paged layer's counters (i from 0): its model layer index, hits and misses over
// every stream. Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG for a NULL argument,
// PYQSA_ERR_UNSUPPORTED when ctx does not page, PYQSA_ERR_OUT_OF_RANGE past the last one.
PYQSA_API int32_t pyqsa_paging_layer_get(const void * ctx, int32_t i, int32_t * il, uint64_t * hits,
                                         uint64_t * misses);

// A sequence's state, for a prefix cache, in two parts, so that the large one can be copied off
// the engine's thread and shared between the states of one sequence at several lengths:
// - the head: llama.cpp's cell metadata of the QSA layers' and the indexer's caches, the Gated
//   DeltaNet recurrent and conv states, and with paging the pager's rows of the incomplete tail
//   block (raw keys and K/V in the rings);
// - the rows: what the sequence holds per position and does not write again while it only grows:
//   each QSA layer's K and V (the host store with paging), the indexer's raw keys (unpaged), the
//   pager's block keys (with paging; one row per r positions). The rows of positions [start, end)
//   are a segment: for each series of rows in the head's order, its rows [start / r, end / r).
//   ctx: struct llama_context *; seq_id: the sequence (one KV stream per sequence), whose cells
//   must hold its positions 0..n-1 in order (as a sequence that only grows does)
typedef struct pyqsa_seq_rows pyqsa_seq_rows;  // where a saved sequence's rows are, for any thread

typedef struct pyqsa_rows_segment {
    const void * data;  // pyqsa_seq_rows_get's bytes of positions [start, end)
    size_t       size;
    uint32_t     start;
    uint32_t     end;
} pyqsa_rows_segment;

typedef struct pyqsa_seq_stage pyqsa_seq_stage;  // where a head's recurrent state waits for the host

// Writes the head of sequence seq_id into a buffer of its own: *head (free it with
// pyqsa_seq_head_free), *size its length; with a non-NULL rows, *rows becomes a new handle on the
// sequence's rows as of now (free it with pyqsa_seq_rows_free). Waits for the device. With a
// non-NULL stage, the Gated DeltaNet recurrent and conv states (most of a head: ~80 MB a
// sequence at Flash-Next's shape) and the tail block's rows are copied into the stage instead,
// their bytes of the head left unwritten until pyqsa_seq_stage_fill (on any thread) copies them
// there: the copy into the head's memory leaves the thread that steps the context. Where the
// stage's device queues reads, they follow the context's passes on its stream and the save waits
// for nothing (the rows are then to be read after pyqsa_seq_stage_fill). Returns PYQSA_OK,
// PYQSA_ERR_INVALID_ARG for a NULL ctx, head or size, a seq_id outside the context or a stage not
// filled since its last save, PYQSA_ERR_OUT_OF_MEMORY when the host has no room for the head,
// PYQSA_ERR_UNSUPPORTED for a context without a hybrid memory or cells not in position order (or
// a transposed V cache).
PYQSA_API int32_t pyqsa_seq_state_save(void * ctx, int32_t seq_id, pyqsa_seq_stage * stage, void ** head,
                                       size_t * size, pyqsa_seq_rows ** rows);

// A stage for heads of ctx's sequences (one head at a time): one sequence's recurrent and conv
// states in the pinned host memory of their device (host memory on a CPU device), so the save's
// copy runs at the bus's speed. Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG for a NULL argument,
// PYQSA_ERR_UNSUPPORTED for a context without a hybrid memory, PYQSA_ERR_OUT_OF_MEMORY.
PYQSA_API int32_t pyqsa_seq_stage_new(void * ctx, pyqsa_seq_stage ** stage);

// Copies what the last save staged into its head (head, size: that save's *head and *size), or
// with a NULL head drops it; the stage is free for the next save. Any thread; PYQSA_OK at once
// when nothing is staged. Returns PYQSA_ERR_INVALID_ARG for a NULL stage or a head smaller than
// the one staged for.
PYQSA_API int32_t pyqsa_seq_stage_fill(pyqsa_seq_stage * stage, void * head, size_t size);

// Frees a stage (after its fill, or with what it holds); before its context is freed.
PYQSA_API void pyqsa_seq_stage_free(pyqsa_seq_stage * stage);

PYQSA_API void pyqsa_seq_head_free(void * head);

typedef struct pyqsa_rows_reader pyqsa_rows_reader;  // copies of rows on one thread

// Copies the segment [start, end) into dst (cap bytes). Callable on any thread while the context
// runs, as long as the sequence's cells of those positions are not written meanwhile: the
// sequence may grow, but not be removed, shortened or loaded into until the copy returns. With a
// reader (one thread's at a time), the device's rows come through its pinned memory on its own
// stream; NULL reads each at once. Returns PYQSA_OK, PYQSA_ERR_INVALID_ARG for a NULL rows or dst,
// PYQSA_ERR_OUT_OF_RANGE unless start <= end <= the saved length and cap holds the segment.
PYQSA_API int32_t pyqsa_seq_rows_get(const pyqsa_seq_rows * rows, uint32_t start, uint32_t end, void * dst,
                                     size_t cap, pyqsa_rows_reader * reader);

// A reader for pyqsa_seq_rows_get of ctx's rows: a stream of its own on the device that holds
// ctx's layers and 16 MiB of its pinned host memory, so a copy of rows moves at the bus's speed
// beside the context's passes, not through the driver's pageable path. Returns PYQSA_OK,
// PYQSA_ERR_INVALID_ARG for a NULL argument, PYQSA_ERR_UNSUPPORTED where the layers are on the CPU
// or on several devices, or the device queues no reads (read at once there: a NULL reader),
// PYQSA_ERR_OUT_OF_MEMORY.
PYQSA_API int32_t pyqsa_rows_reader_new(void * ctx, pyqsa_rows_reader ** reader);

// Frees a reader (no copy through it running); before its context is freed.
PYQSA_API void pyqsa_rows_reader_free(pyqsa_rows_reader * reader);

PYQSA_API void pyqsa_seq_rows_free(pyqsa_seq_rows * rows);

// A handle on the rows of sequence seq_id's positions as of now, as pyqsa_seq_state_save's *rows
// but without a head: a sequence that grows (a prompt being computed) has its rows copied ahead
// of its next save, which then copies only the rows since. Waits for the device. Returns
// PYQSA_OK, PYQSA_ERR_INVALID_ARG for a NULL ctx or rows or a seq_id outside the context,
// PYQSA_ERR_UNSUPPORTED as pyqsa_seq_state_save.
PYQSA_API int32_t pyqsa_seq_rows_open(void * ctx, int32_t seq_id, pyqsa_seq_rows ** rows);

// The bytes of the segment [start, end) of rows (what pyqsa_seq_rows_get copies). Returns
// PYQSA_OK, PYQSA_ERR_INVALID_ARG for a NULL argument, PYQSA_ERR_OUT_OF_RANGE unless
// start <= end <= the rows' length.
PYQSA_API int32_t pyqsa_seq_rows_bytes(const pyqsa_seq_rows * rows, uint32_t start, uint32_t end, size_t * size);

// Loads a state (its head, and segments covering positions [0, n) in order) of a context with
// the same settings into sequence seq_id, replacing what it held. Returns PYQSA_OK;
// PYQSA_ERR_INVALID_ARG for a NULL argument, a seq_id outside the context, bytes that are not
// such a state or segments that do not cover it (the sequence is then left empty);
// PYQSA_ERR_UNSUPPORTED for a context without a hybrid memory.
PYQSA_API int32_t pyqsa_seq_state_load(void * ctx, int32_t seq_id, const void * head, size_t head_size,
                                       const pyqsa_rows_segment * segments, size_t n_segments);

// Makes sequence seq_id the state of the head, without copying its rows: the sequence holds at
// least the state's n positions and its rows of positions [0, n) are the state's (the same tokens,
// computed as they were when it was saved). Positions from n on are removed, the head loaded.
// Returns as pyqsa_seq_state_load does (also PYQSA_ERR_INVALID_ARG when the sequence holds fewer
// than n positions; the sequence is left empty on an error).
PYQSA_API int32_t pyqsa_seq_state_resume(void * ctx, int32_t seq_id, const void * head, size_t head_size);

// An abort callback for llama_set_abort_callback (a ggml_abort_callback): true while the
// int32_t at `flag` is nonzero, false for a NULL flag. Another thread stops a llama_decode by
// setting the flag; the compute loop checks it after every graph node without calling into
// Python (a ctypes callback would take the GIL there). Only backends that implement the abort
// callback check it: CPU and Metal in the pinned upstream, not CUDA.
PYQSA_API bool pyqsa_abort_flag_is_set(void * flag);

// Takes the calling thread's last error from pyqsa's code inside llama_decode (an invariant
// of the QSA path that a batch broke: the pass ran with safe inputs, and the sequences it named
// hold wrong state that the caller must discard). Copies it into buf (NUL-terminated, cut to
// cap) and returns its length, or 0 when there was none; PYQSA_ERR_INVALID_ARG for a NULL or
// empty buf while an error is pending (the error is kept).
PYQSA_API int32_t pyqsa_last_error(char * buf, size_t cap);

// One row's sampling (pyqsa/engine/sampler.py is the reference; native/ggml/sample-row.cpp and
// the sample op of pyqsa-ggml.h implement the same rules). Temperature 0 is greedy: the
// largest logit, the lowest id on ties. Otherwise, on y = logit / temperature: top_k keeps the
// k best ids by (logit desc, id asc); min_p keeps ids with exp(y - y_max) >= min_p; top_p keeps
// the shortest prefix in (y desc, id asc) order whose mass reaches top_p; then the id with the
// largest y - log(-log(u)), u the request's counter-based uniform for (seed, counter, id).
typedef struct pyqsa_sample_params {
    float    temperature;  // 0: greedy
    int32_t  top_k;        // 0: off
    float    top_p;        // 1: off
    float    min_p;        // 0: off
    uint32_t seed_lo;      // the request's 64-bit seed
    uint32_t seed_hi;
    uint32_t counter;      // which draw of the request this is (0, 1, ...)
    int32_t  n_top;        // -1: no log-probabilities; 0..20: the token's and the n_top best's
} pyqsa_sample_params;

// The drawn token and log-probabilities under softmax of the raw row (not tempered or cut;
// logprob is NaN when n_top is -1); top ids in (logit desc, id asc) order, -1 past n_top.
typedef struct pyqsa_sample_result {
    int32_t token;
    float   logprob;
    int32_t top_ids[20];
    float   top_logprobs[20];
} pyqsa_sample_result;

// One token's logit adjustment before a draw (the reference: apply_penalties in
// pyqsa/engine/sampler.py), in float32: x += bias (logit bias); then, unless rep is 1,
// x = x > 0 ? x / rep : x * rep (the repetition penalty of a token in the prompt or output);
// then x -= sub (frequency * count + presence of a token in the output). A row's list holds
// distinct ids and ends at its first negative id (or its capacity); an id past the vocabulary
// changes nothing.
typedef struct pyqsa_logit_adjust {
    int32_t id;
    float   bias;
    float   rep;
    float   sub;
} pyqsa_logit_adjust;

// Samples one row of n_vocab logits on the host (the CPU kernel of the sample op), adjusted by
// the first n_adjust entries of `adjust` (NULL when n_adjust is 0). PYQSA_ERR_INVALID_ARG for a
// NULL pointer, n_vocab < 1 or above INT32_MAX, n_adjust < 0, or n_top outside -1..20.
PYQSA_API int32_t pyqsa_sample(const float * logits, int64_t n_vocab, const pyqsa_sample_params * params,
                               const pyqsa_logit_adjust * adjust, int64_t n_adjust, pyqsa_sample_result * out);

// Sampling inside llama_decode (llama.cpp's backend sampling): a sampler chain whose one
// sampler adds the sample op for its sequence's output row, so only the row's result, not its
// logits, comes back; it takes up to max_adjust logit adjustments a draw (0: none, and no
// input for them in the graph). Free it with pyqsa_sampler_free once no context holds it.
// NULL for max_adjust outside 0..65536.
PYQSA_API void * pyqsa_sampler_new(int32_t max_adjust);
PYQSA_API void   pyqsa_sampler_free(void * sampler);

// The parameters and logit adjustments (n_adjust entries, NULL when 0) of the next draw of the
// sampler's sequence (read when a ubatch holding that sequence's output is computed).
// PYQSA_ERR_INVALID_ARG for NULL, a sampler not made by pyqsa_sampler_new, n_top outside
// -1..20, or n_adjust outside 0..max_adjust.
PYQSA_API int32_t pyqsa_sampler_set(void * sampler, const pyqsa_sample_params * params,
                                    const pyqsa_logit_adjust * adjust, int32_t n_adjust);

// Attaches the sampler to a sequence of a llama context (llama_set_sampler), or detaches with
// NULL; the context's next decode builds its graphs again. PYQSA_ERR_UNSUPPORTED when the
// context cannot take it (a tensor-split model), PYQSA_ERR_INVALID_ARG for a NULL context.
PYQSA_API int32_t pyqsa_sampler_attach(void * ctx, int32_t seq_id, void * sampler);

// The result of output i of the last decode, drawn by an attached sampler.
// PYQSA_ERR_OUT_OF_RANGE when output i was not drawn that way.
PYQSA_API int32_t pyqsa_sampled_get(void * ctx, int32_t i, pyqsa_sample_result * out);

// cffi-end

#ifdef __cplusplus
}
#endif
