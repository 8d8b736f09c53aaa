/* Streams, events, graphs and launch forms against the simulated timeline.
 * Prints one line per failed check and exits with the number of failures. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "api.h"

static int failures;
#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #cond);                      \
            failures++;                                                                \
        }                                                                              \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static CUfunction fn;

static CUresult launch_on(CUstream s, unsigned long long us)
{
    void *params[] = {&us};
    return cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

int main(void)
{
    CUcontext ctx;
    CUmodule mod;
    CUstream s;
    CUevent a, b;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CHECK(cuModuleLoadData(&mod, "image") == CUDA_SUCCESS);
    CHECK(cuModuleGetFunction(&fn, mod, "any_name_works") == CUDA_SUCCESS);
    CHECK(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
    CHECK(cuEventCreate(&a, 0) == CUDA_SUCCESS);
    CHECK(cuEventCreate(&b, 0) == CUDA_SUCCESS);

    /* A 100 ms kernel: launch is asynchronous, queries say not ready,
     * synchronisation waits for it, events time it. */
    double t0 = now_ms();
    CHECK(cuEventRecord(a, s) == CUDA_SUCCESS);
    CHECK(launch_on(s, 100000) == CUDA_SUCCESS);
    CHECK(cuEventRecord(b, s) == CUDA_SUCCESS);
    CHECK(now_ms() - t0 < 20);
    CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
    CHECK(cuEventQuery(b) == CUDA_ERROR_NOT_READY);
    float ms = 0;
    CHECK(cuEventElapsedTime_v2(&ms, a, b) == CUDA_ERROR_NOT_READY);
    CHECK(cuEventSynchronize(b) == CUDA_SUCCESS);
    double waited = now_ms() - t0;
    CHECK(waited >= 99 && waited < 150);
    CHECK(cuStreamQuery(s) == CUDA_SUCCESS);
    CHECK(cuEventElapsedTime_v2(&ms, a, b) == CUDA_SUCCESS);
    CHECK(ms > 99.0f && ms < 101.0f);

    /* Stream sync waits for that stream; context sync for everything. */
    t0 = now_ms();
    CHECK(launch_on(s, 50000) == CUDA_SUCCESS);
    CHECK(launch_on(NULL, 50000) == CUDA_SUCCESS); /* legacy stream: after s's kernel */
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    waited = now_ms() - t0;
    CHECK(waited >= 49 && waited < 90);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    waited = now_ms() - t0;
    CHECK(waited >= 99 && waited < 140);

    /* Per-thread default stream (_ptsz forms with the NULL stream). */
    t0 = now_ms();
    unsigned long long us = 30000;
    void *params[] = {&us};
    CHECK(cuLaunchKernel_ptsz(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) == CUDA_SUCCESS);
    CHECK(cuStreamQuery_ptsz(NULL) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamSynchronize_ptsz(CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
    waited = now_ms() - t0;
    CHECK(waited >= 29 && waited < 70);

    /* cuLaunchKernelEx and the `extra` buffer form carry the duration too;
     * a grid of many blocks costs the same as one block. */
    t0 = now_ms();
    CUlaunchConfig cfg = {.gridDimX = 1000, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 256,
                          .blockDimY = 1, .blockDimZ = 1, .hStream = s};
    us = 20000;
    CHECK(cuLaunchKernelEx(&cfg, fn, params, NULL) == CUDA_SUCCESS);
    unsigned long long buf[2] = {20000, 7};
    size_t size = sizeof buf;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, NULL, extra) == CUDA_SUCCESS);
    CHECK(cuLaunchCooperativeKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    waited = now_ms() - t0;
    CHECK(waited >= 59 && waited < 100);
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, extra) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_ERROR_INVALID_HANDLE);

    /* Stream capture: nothing runs while capturing; the graph replays. */
    CUgraph g;
    CUgraphExec x;
    CUstreamCaptureStatus st;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    t0 = now_ms();
    for (int i = 0; i < 3; i++)
        CHECK(launch_on(s, 20000) == CUDA_SUCCESS);
    CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
    CHECK(cuGraphInstantiateWithFlags(&x, g, 0) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch(x, s) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch_ptsz(x, s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    waited = now_ms() - t0;
    CHECK(waited >= 119 && waited < 170);
    CHECK(cuGraphExecDestroy(x) == CUDA_SUCCESS);
    CHECK(cuGraphDestroy(g) == CUDA_SUCCESS);
    /* Querying a capturing stream is invalid and invalidates the capture (as the driver). */
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(launch_on(s, 1000) == CUDA_SUCCESS);
    CHECK(cuStreamQuery(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(cuGraphLaunch(x, s) == CUDA_ERROR_INVALID_VALUE);

    /* Destroyed handles are refused, not crashed on. */
    CHECK(cuEventDestroy_v2(a) == CUDA_SUCCESS);
    CHECK(cuEventQuery(a) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuModuleUnload(mod) == CUDA_SUCCESS);
    CHECK(launch_on(NULL, 1) == CUDA_ERROR_INVALID_HANDLE);

    const char *name = NULL, *text = NULL;
    CHECK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name) == CUDA_SUCCESS &&
          strcmp(name, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    CHECK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &text) == CUDA_SUCCESS && text);
    CHECK(cuGetErrorName(12345, &name) == CUDA_ERROR_INVALID_VALUE);
    printf("done %d\n", failures);
    return failures;
}
