/* GPU workloads for the compute and latency benchmarks, on the GPU simulator
 * (a kernel runs for the microseconds in its first parameter), through
 * libvcuda when it is preloaded. The driver is dlopen'ed from
 * $VCUDA_REAL_LIBCUDA and its entry points taken with dlsym, as applications do.
 *
 *   workload train KERNEL_US DEPTH SECONDS
 *       a trainer: DEPTH launches, then synchronise, for SECONDS. Prints
 *       {"kernel_us", "kernels", "start_ns", "end_ns", "syncs": [[t_ns, kernels done], ...]}
 *   workload infer KERNELS KERNEL_US RATE SECONDS SEED
 *       an inference server: requests of KERNELS launches then a synchronise,
 *       arriving as a Poisson process of RATE per second (seeded), served one
 *       at a time. Prints {"requests", "busy_us", "start_ns", "end_ns",
 *       "latency_us": [arrival -> completion, ...]}
 *
 * Times are CLOCK_MONOTONIC nanoseconds, so runs side by side can be aligned. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vcuda/cuda_abi.h"

static struct {
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*module_load)(CUmodule *, const void *);
    CUresult (*get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **);
    CUresult (*sync)(void);
} cu;

static CUfunction fn;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static int fail(const char *what, CUresult rc) {
    fprintf(stderr, "workload: %s failed with CUresult %d\n", what, rc);
    return 1;
}

static int setup(void) {
    const char *path = getenv("VCUDA_REAL_LIBCUDA");
    void *h = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "workload: %s\n", dlerror());
        return 1;
    }
#define TAKE(slot, name) *(void **)&cu.slot = dlsym(h, name)
    TAKE(init, "cuInit");
    TAKE(retain, "cuDevicePrimaryCtxRetain");
    TAKE(set_current, "cuCtxSetCurrent");
    TAKE(module_load, "cuModuleLoadData");
    TAKE(get_function, "cuModuleGetFunction");
    TAKE(launch, "cuLaunchKernel");
    TAKE(sync, "cuCtxSynchronize");
#undef TAKE
    CUcontext ctx;
    CUmodule mod;
    CUresult rc;
    if ((rc = cu.init(0)) != CUDA_SUCCESS) return fail("cuInit", rc);
    if ((rc = cu.retain(&ctx, 0)) != CUDA_SUCCESS || (rc = cu.set_current(ctx)) != CUDA_SUCCESS)
        return fail("context", rc);
    if ((rc = cu.module_load(&mod, "workload")) != CUDA_SUCCESS ||
        (rc = cu.get_function(&fn, mod, "spin")) != CUDA_SUCCESS)
        return fail("module", rc);
    return 0;
}

static CUresult launch(uint64_t *us) {
    void *params[] = {us};
    return cu.launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
}

static int train(uint64_t kernel_us, long depth, double seconds) {
    size_t cap = 1024, n = 0;
    uint64_t(*syncs)[2] = malloc(cap * sizeof *syncs);
    long kernels = 0;
    uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
    CUresult rc = CUDA_SUCCESS;
    while (rc == CUDA_SUCCESS && now_ns() < end) {
        for (long i = 0; i < depth && rc == CUDA_SUCCESS; i++) rc = launch(&kernel_us);
        if (rc == CUDA_SUCCESS) rc = cu.sync();
        kernels += depth;
        if (n == cap) syncs = realloc(syncs, (cap *= 2) * sizeof *syncs);
        syncs[n][0] = now_ns();
        syncs[n++][1] = (uint64_t)kernels;
    }
    if (rc != CUDA_SUCCESS) return fail("train", rc);
    printf("{\"kernel_us\": %llu, \"kernels\": %ld, \"start_ns\": %llu, \"end_ns\": %llu, \"syncs\": [",
           (unsigned long long)kernel_us, kernels, (unsigned long long)start, (unsigned long long)now_ns());
    for (size_t i = 0; i < n; i++)
        printf("%s[%llu, %llu]", i ? ", " : "", (unsigned long long)syncs[i][0], (unsigned long long)syncs[i][1]);
    printf("]}\n");
    return 0;
}

static int infer(long kernels, uint64_t kernel_us, double rate, double seconds, unsigned seed) {
    size_t cap = (size_t)(rate * seconds * 2) + 16, n = 0;
    double *latency = malloc(cap * sizeof *latency);
    srand48(seed);
    uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
    double arrival = (double)start;
    CUresult rc = CUDA_SUCCESS;
    for (;;) {
        arrival += -log(1.0 - drand48()) / rate * 1e9; /* exponential gaps */
        if (arrival >= (double)end || n == cap) break;
        sleep_until((uint64_t)arrival); /* returns at once when behind */
        for (long i = 0; i < kernels && rc == CUDA_SUCCESS; i++) rc = launch(&kernel_us);
        if (rc == CUDA_SUCCESS) rc = cu.sync();
        if (rc != CUDA_SUCCESS) return fail("infer", rc);
        latency[n++] = ((double)now_ns() - arrival) / 1e3;
    }
    printf("{\"requests\": %zu, \"busy_us\": %llu, \"start_ns\": %llu, \"end_ns\": %llu, \"latency_us\": [", n,
           (unsigned long long)(n * (size_t)kernels * kernel_us), (unsigned long long)start,
           (unsigned long long)now_ns());
    for (size_t i = 0; i < n; i++) printf("%s%.1f", i ? ", " : "", latency[i]);
    printf("]}\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "train") == 0) {
        if (setup() != 0) return 1;
        return train(strtoull(argv[2], NULL, 10), atol(argv[3]), atof(argv[4]));
    }
    if (argc >= 7 && strcmp(argv[1], "infer") == 0) {
        if (setup() != 0) return 1;
        return infer(atol(argv[2]), strtoull(argv[3], NULL, 10), atof(argv[4]), atof(argv[5]),
                     (unsigned)atoi(argv[6]));
    }
    fprintf(stderr, "usage: workload train KERNEL_US DEPTH SECONDS\n"
                    "       workload infer KERNELS KERNEL_US RATE SECONDS SEED\n");
    return 2;
}
