// What the op-check binaries (test-qsa-ops, test-qsa-page, test-sample, test-products) share: their
// main (the command line), the one-line result of each check, running a check on every backend
// but the CPU, running one op, keeping a graph to time it, and the error measure of float results.
#pragma once

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

// a mode of an op-check binary: its name on the command line and what runs it (given the backend
// named by -b, or null for all)
struct op_check_mode {
    const char * name;
    int (*run)(const char * backend);
};

// main() of an op-check binary: argv [MODE] [-b BACKEND], MODE one of `modes` (the first is the
// default). Loads every backend and returns the mode's exit code, or 2 after printing the usage
// line for anything else.
inline int op_check_main(int argc, char ** argv, std::initializer_list<op_check_mode> modes) {
    // a line at a time into a pipe too, so a run stopped by a timeout keeps what it printed
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const op_check_mode * mode    = modes.begin();
    const char *          backend = nullptr;
    for (int i = 1; i < argc; ++i) {
        const op_check_mode * named = nullptr;
        for (const op_check_mode & m : modes) {
            if (std::strcmp(argv[i], m.name) == 0) named = &m;
        }
        if (std::strcmp(argv[i], "-b") == 0 && i + 1 < argc) {
            backend = argv[++i];
        } else if (named) {
            mode = named;
        } else {
            std::string usage;
            for (const op_check_mode & m : modes) {
                usage += (usage.empty() ? "" : "|") + std::string(m.name);
            }
            std::fprintf(stderr, "usage: %s [%s] [-b BACKEND]\n", argv[0], usage.c_str());
            return 2;
        }
    }
    ggml_backend_load_all();
    return mode->run(backend);
}

// counts one check: prints "<case> <backend>: <detail> OK|FAIL"
inline void report(const std::string & name, const char * backend, const std::string & detail, bool ok, int & n_ok,
                   int & n_fail) {
    std::printf("  %s %s: %s%s\n", name.c_str(), backend, detail.c_str(), ok ? "OK" : "FAIL");
    ok ? ++n_ok : ++n_fail;
}

// runs check(backend) -> {ok, detail} on every non-CPU backend (or only the one named)
template <typename F>
void on_other_backends(const char * only_backend, const std::string & name, int & n_ok, int & n_fail, F && check) {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) continue;
        if (only_backend && std::strcmp(only_backend, ggml_backend_dev_name(dev)) != 0) continue;
        ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
        const std::pair<bool, std::string> r = check(be);
        report(name, ggml_backend_dev_name(dev), r.second, r.first, n_ok, n_fail);
        ggml_backend_free(be);
    }
}

// microseconds per compute of gf on be, after one untimed run; a failed compute ends the binary
inline double time_graph(ggml_backend_t be, ggml_cgraph * gf, int iters) {
    const auto compute = [&] {
        if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
            std::fprintf(stderr, "compute failed\n");
            std::exit(2);
        }
    };
    compute();
    ggml_backend_synchronize(be);
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it) compute();
    ggml_backend_synchronize(be);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// the microseconds of 5 computes of gf on be, sorted, after one untimed run
inline std::vector<double> sorted_runs_us(ggml_backend_t be, ggml_cgraph * gf) {
    std::vector<double> us;
    for (int rep = -1; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(be, gf);
        ggml_backend_synchronize(be);
        if (rep >= 0) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    return us;
}

// one op's context, graph and buffer, freed together (a graph kept to run or time it)
struct graph_run {
    ggml_context *        ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ggml_cgraph *         gf  = nullptr;
    ggml_tensor *         out = nullptr;
    ~graph_run() {
        if (buf) ggml_backend_buffer_free(buf);
        if (ctx) ggml_free(ctx);
    }
};

// builds g.gf, the graph of out (made in g.ctx), and allocates g.ctx's tensors on be; false, with
// nothing allocated, when be does not support out
inline bool graph_place(graph_run & g, ggml_backend_t be, ggml_tensor * out) {
    if (!ggml_backend_supports_op(be, out)) return false;
    g.out = out;
    g.gf  = ggml_new_graph(g.ctx);
    ggml_build_forward_expand(g.gf, out);
    g.buf = ggml_backend_alloc_ctx_tensors(g.ctx, be);
    return true;
}

// an op with a result of element type T on backend: make(ctx) -> {input, output}; upload(input)
// (inputs beyond the first are captured by make and upload)
template <typename T, typename Make, typename Upload>
std::vector<T> run_op(ggml_backend_t backend, Make && make, Upload && upload, bool * supported) {
    // room for a few ops: a graph of upstream's ops that one of pyqsa's replaces (test-fused)
    ggml_init_params ip = { ggml_tensor_overhead() * 32 + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    const std::pair<ggml_tensor *, ggml_tensor *> io = make(ctx);
    std::vector<T> res;
    *supported = ggml_backend_supports_op(backend, io.second);
    if (*supported) {
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, io.second);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
        upload(io.first);
        ggml_backend_graph_compute(backend, gf);
        res.resize(ggml_nelements(io.second));
        ggml_backend_tensor_get(io.second, res.data(), 0, ggml_nbytes(io.second));
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    return res;
}

// sum of squared differences over the reference's sum of squares (the plain sum when the reference
// is all zeros); infinite when the sizes differ
inline double nmse(const std::vector<float> & a, const std::vector<float> & ref) {
    if (a.size() != ref.size()) return INFINITY;
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double diff = (double) a[i] - ref[i];
        err += diff * diff;
        norm += (double) ref[i] * ref[i];
    }
    return norm > 0.0 ? err / norm : err;
}

inline std::string sci(double x) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3e", x);
    return buf;
}
