// bench/host_split.py's LD_PRELOAD library: the CUDA runtime calls of each thread, counted and
// timed (the host's part of a step: its synchronous copies and waits), and each thread's waits
// for the GIL (PyEval_RestoreThread, below). shim_snapshot() hands the
// figures to a caller in the process; with $SHIM_OUT set, a snapshot is appended there each time
// $SHIM_OUT.trigger appears (its first line the mark, the file then removed) and at exit.
//   gcc -O2 -shared -fPIC -o /tmp/cuda_calls.so bench/cuda_calls.c -ldl -lpthread
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { MEMCPY_ASYNC, MEMCPY2D_ASYNC, MEMCPY, STREAM_SYNC, GRAPH_LAUNCH, GRAPH_EXEC_UPDATE, BEGIN_CAPTURE,
       END_CAPTURE, INSTANTIATE, EVENT_SYNC, EVENT_RECORD, WAIT_EVENT, MEMSET_ASYNC, MALLOC, FREE, DEVICE_SYNC,
       GIL_TAKE, GIL_TAKE_LONG, N_CALLS };
static const char * names[N_CALLS] = { "cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpy", "cudaStreamSynchronize",
    "cudaGraphLaunch", "cudaGraphExecUpdate", "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
    "cudaEventSynchronize", "cudaEventRecord", "cudaStreamWaitEvent", "cudaMemsetAsync", "cudaMalloc", "cudaFree",
    "cudaDeviceSynchronize", "GIL_wait", "GIL_wait_over_1ms" };

#define MAX_THREADS 64
typedef struct {
    long      tid;
    long long n[N_CALLS];
    double    seconds[N_CALLS];
} thread_calls;
static thread_calls    threads[MAX_THREADS];
static int             n_threads;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread thread_calls * mine;

static thread_calls * calls(void) {
    if (!mine) {  // the last entry is shared past MAX_THREADS threads
        pthread_mutex_lock(&lock);
        mine = &threads[n_threads < MAX_THREADS ? n_threads++ : MAX_THREADS - 1];
        mine->tid = syscall(SYS_gettid);
        pthread_mutex_unlock(&lock);
    }
    return mine;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// the runtime's own function: libcudart is loaded by a library ctypes opened (local scope), so
// RTLD_NEXT alone does not find it
static void * real(const char * name) {
    static void * cudart;
    if (!cudart) cudart = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
    void * f = cudart ? dlsym(cudart, name) : NULL;
    if (!f) f = dlsym(RTLD_NEXT, name);
    if (!f) {
        fprintf(stderr, "cuda_calls: no %s\n", name);
        abort();
    }
    return f;
}

#define WRAP(idx, name, params, args)                           \
    int name params {                                           \
        static int (*f) params;                                 \
        if (!f) f = real(#name);                                \
        thread_calls * t  = calls();                            \
        double         t0 = now();                              \
        int            rc = f args;                             \
        t->seconds[idx] += now() - t0;                          \
        t->n[idx]++;                                            \
        return rc;                                              \
    }

WRAP(MEMCPY_ASYNC, cudaMemcpyAsync, (void * d, const void * s, size_t n, int k, void * st), (d, s, n, k, st))
WRAP(MEMCPY2D_ASYNC, cudaMemcpy2DAsync,
     (void * d, size_t dp, const void * s, size_t sp, size_t w, size_t h, int k, void * st), (d, dp, s, sp, w, h, k, st))
WRAP(MEMCPY, cudaMemcpy, (void * d, const void * s, size_t n, int k), (d, s, n, k))
WRAP(STREAM_SYNC, cudaStreamSynchronize, (void * st), (st))
WRAP(GRAPH_LAUNCH, cudaGraphLaunch, (void * g, void * st), (g, st))
WRAP(GRAPH_EXEC_UPDATE, cudaGraphExecUpdate, (void * e, void * g, void * info), (e, g, info))
WRAP(BEGIN_CAPTURE, cudaStreamBeginCapture, (void * st, int mode), (st, mode))
WRAP(END_CAPTURE, cudaStreamEndCapture, (void * st, void ** g), (st, g))
WRAP(INSTANTIATE, cudaGraphInstantiate, (void ** e, void * g, unsigned long long flags), (e, g, flags))
WRAP(EVENT_SYNC, cudaEventSynchronize, (void * e), (e))
WRAP(EVENT_RECORD, cudaEventRecord, (void * e, void * st), (e, st))
WRAP(WAIT_EVENT, cudaStreamWaitEvent, (void * st, void * e, unsigned flags), (st, e, flags))
WRAP(MEMSET_ASYNC, cudaMemsetAsync, (void * d, int v, size_t n, void * st), (d, v, n, st))
WRAP(MALLOC, cudaMalloc, (void ** p, size_t n), (p, n))
WRAP(FREE, cudaFree, (void * p), (p))
WRAP(DEVICE_SYNC, cudaDeviceSynchronize, (void), ())

// The GIL taken back after a call that let go of it (each ctypes and cffi call, socket I/O, a lock's
// wait): the wait for the GIL, counted as the calls above. Only calls from extension modules into a
// shared libpython come here; where libpython is linked into the executable nothing does (no
// GIL_wait lines). GIL_wait_over_1ms: those waits that took more than 1 ms, apart.
void PyEval_RestoreThread(void * tstate) {
    static void (*f)(void *);
    if (!f) f = (void (*)(void *)) dlsym(RTLD_NEXT, "PyEval_RestoreThread");
    thread_calls * t  = calls();
    double         t0 = now();
    f(tstate);
    const double dt = now() - t0;
    t->seconds[GIL_TAKE] += dt;
    t->n[GIL_TAKE]++;
    if (dt > 1e-3) {
        t->seconds[GIL_TAKE_LONG] += dt;
        t->n[GIL_TAKE_LONG]++;
    }
}

// every thread's calls so far as lines "tid name count seconds"; returns the bytes written
int shim_snapshot(char * buf, int len) {
    int o = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_threads; ++i) {
        for (int c = 0; c < N_CALLS && o < len; ++c) {
            if (threads[i].n[c]) {
                o += snprintf(buf + o, len - o, "%ld %s %lld %.9f\n", threads[i].tid, names[c], threads[i].n[c],
                              threads[i].seconds[c]);
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return o < len ? o : len;
}

static void dump(const char * mark) {
    static char buf[1 << 16];
    const int   n = shim_snapshot(buf, sizeof buf);
    FILE *      f = fopen(getenv("SHIM_OUT"), "a");
    if (f) {
        fprintf(f, "== %s %.6f\n", mark, now());
        fwrite(buf, 1, n, f);
        fclose(f);
    }
}

static void * watch(void * arg) {
    char trigger[4096];
    (void) arg;
    snprintf(trigger, sizeof trigger, "%s.trigger", getenv("SHIM_OUT"));
    for (;;) {
        FILE * f = fopen(trigger, "r");
        if (f) {
            char mark[256] = "";
            if (!fgets(mark, sizeof mark, f)) mark[0] = 0;
            fclose(f);
            mark[strcspn(mark, "\n")] = 0;
            unlink(trigger);
            dump(mark);
        }
        usleep(5000);
    }
    return NULL;
}

__attribute__((constructor)) static void start(void) {
    if (getenv("SHIM_OUT")) {
        pthread_t t;
        pthread_create(&t, NULL, watch, NULL);
        pthread_detach(t);
    }
}

__attribute__((destructor)) static void at_exit(void) {
    if (getenv("SHIM_OUT")) dump("exit");
}
