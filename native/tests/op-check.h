// What the op-check binaries (test-qsa-ops, test-qsa-page) share: their command line, the
// one-line result of each check, and running a check on every backend but the CPU.
#pragma once

#include "ggml-backend.h"

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

// argv: [MODE] [-b BACKEND], MODE one of `modes` (the first is the default). Returns false
// after printing the usage line for anything else.
inline bool op_check_args(int argc, char ** argv, std::initializer_list<const char *> modes, const char ** mode,
                          const char ** backend) {
    *mode    = *modes.begin();
    *backend = nullptr;
    for (int i = 1; i < argc; ++i) {
        bool known = false;
        for (const char * m : modes) {
            known = known || std::strcmp(argv[i], m) == 0;
        }
        if (std::strcmp(argv[i], "-b") == 0 && i + 1 < argc) {
            *backend = argv[++i];
        } else if (known) {
            *mode = argv[i];
        } else {
            std::string usage;
            for (const char * m : modes) {
                usage += (usage.empty() ? "" : "|") + std::string(m);
            }
            std::fprintf(stderr, "usage: %s [%s] [-b BACKEND]\n", argv[0], usage.c_str());
            return false;
        }
    }
    return true;
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
