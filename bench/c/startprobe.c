/* Process start cost: prints CLOCK_MONOTONIC (ns) at the first successful
 * allocation, so the caller can subtract the time it started us. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vcuda/cuda_abi.h"

int main(void) {
    void *h = dlopen(getenv("VCUDA_REAL_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
    if (!h) return 1;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))(uintptr_t)dlsym(h, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))(uintptr_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))(uintptr_t)dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))(uintptr_t)dlsym(h, "cuMemAlloc_v2");
    CUcontext ctx;
    CUdeviceptr p;
    if (init(0) || retain(&ctx, 0) || setcur(ctx) || alloc(&p, 1)) return 2;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    return 0;
}
