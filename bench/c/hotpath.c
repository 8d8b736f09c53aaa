/* Per-call cost of the hooked paths: cuMemAlloc_v2 + cuMemFree_v2 pairs,
 * cuMemAllocAsync + cuMemFreeAsync pairs while the pool has headroom (release
 * threshold UINT64_MAX, so the pool keeps what is freed), cuLaunchKernel, and
 * a function lookup (cuModuleGetFunction), entry points taken the way cudart
 * 12/13 takes them (cuGetProcAddress_v2). Run with and without
 * LD_PRELOAD=libvcuda.so; prints the median ns per call over `rounds` rounds
 * of `iters` calls. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vcuda/cuda_abi.h"

typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *proc(getproc_fn gp, const char *name) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gp(name, &p, 13000, 0, &st) != CUDA_SUCCESS) return NULL;
    return p;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 15, iters = argc > 2 ? atoi(argv[2]) : 20000;
    void *h = dlopen(getenv("VCUDA_REAL_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    getproc_fn gp0 = (getproc_fn)(uintptr_t)dlsym(h, "cuGetProcAddress_v2");
    getproc_fn gp = (getproc_fn)(uintptr_t)proc(gp0, "cuGetProcAddress");
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))(uintptr_t)proc(gp, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))(uintptr_t)proc(gp, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))(uintptr_t)proc(gp, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))(uintptr_t)proc(gp, "cuMemAlloc");
    CUresult (*mfree)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))(uintptr_t)proc(gp, "cuMemFree");
    CUresult (*modload)(CUmodule *, const void *) = (CUresult(*)(CUmodule *, const void *))(uintptr_t)proc(gp, "cuModuleLoadData");
    CUresult (*getfn)(CUfunction *, CUmodule, const char *) = (CUresult(*)(CUfunction *, CUmodule, const char *))(uintptr_t)proc(gp, "cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **) =
        (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **))(uintptr_t)proc(gp, "cuLaunchKernel");
    CUresult (*sync)(CUstream) = (CUresult(*)(CUstream))(uintptr_t)proc(gp, "cuStreamSynchronize");
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) =
        (CUresult(*)(CUdeviceptr *, size_t, CUstream))(uintptr_t)proc(gp, "cuMemAllocAsync");
    CUresult (*free_async)(CUdeviceptr, CUstream) = (CUresult(*)(CUdeviceptr, CUstream))(uintptr_t)proc(gp, "cuMemFreeAsync");
    CUresult (*default_pool)(CUmemoryPool *, CUdevice) =
        (CUresult(*)(CUmemoryPool *, CUdevice))(uintptr_t)proc(gp, "cuDeviceGetDefaultMemPool");
    CUresult (*pool_set)(CUmemoryPool, CUmemPool_attribute, void *) =
        (CUresult(*)(CUmemoryPool, CUmemPool_attribute, void *))(uintptr_t)proc(gp, "cuMemPoolSetAttribute");
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUmemoryPool pool;
    cuuint64_t keep_all = UINT64_MAX;
    if (init(0) || retain(&ctx, 0) || setcur(ctx) || modload(&mod, "bench") || getfn(&fn, mod, "noop") ||
        default_pool(&pool, 0) || pool_set(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all)) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    double *alloc_ns = calloc((size_t)rounds, sizeof(double)), *launch_ns = calloc((size_t)rounds, sizeof(double));
    double *async_ns = calloc((size_t)rounds, sizeof(double)), *lookup_ns = calloc((size_t)rounds, sizeof(double));
    CUdeviceptr p;
    uint64_t zero_us = 0;
    void *params[] = {&zero_us};
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (int i = 0; i < iters; i++) {
            if (alloc(&p, 256) || mfree(p)) { fprintf(stderr, "alloc failed\n"); return 1; }
        }
        alloc_ns[r] = (now_ns() - t0) / iters;
        t0 = now_ns();
        for (int i = 0; i < iters; i++) launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        launch_ns[r] = (now_ns() - t0) / iters;
        sync(NULL);
        t0 = now_ns();
        for (int i = 0; i < iters; i++) {
            if (alloc_async(&p, 256, NULL) || free_async(p, NULL)) { fprintf(stderr, "async alloc failed\n"); return 1; }
        }
        async_ns[r] = (now_ns() - t0) / iters;
        t0 = now_ns();
        for (int i = 0; i < iters; i++) {
            if (getfn(&fn, mod, "noop")) { fprintf(stderr, "lookup failed\n"); return 1; }
        }
        lookup_ns[r] = (now_ns() - t0) / iters;
    }
    qsort(alloc_ns, (size_t)rounds, sizeof(double), cmp);
    qsort(launch_ns, (size_t)rounds, sizeof(double), cmp);
    qsort(async_ns, (size_t)rounds, sizeof(double), cmp);
    qsort(lookup_ns, (size_t)rounds, sizeof(double), cmp);
    printf("{\"alloc_free_ns\": %.1f, \"launch_ns\": %.1f, \"async_pair_ns\": %.1f, \"lookup_ns\": %.1f}\n",
           alloc_ns[rounds / 2], launch_ns[rounds / 2], async_ns[rounds / 2], lookup_ns[rounds / 2]);
    return 0;
}
