/* A scriptable driver client for the simulator tests: each argument is a
 * command, run in order; each command prints one line "<cmd> <CUresult> [...]".
 * Linked against libvcuda-sim-cuda.so; prototypes from gpusim/src/api.h. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sim_tool.h"

CUdeviceptr ptrs[MAXP];
int nptr;
static CUcontext ctxs[64];
static int nctx;
CUstream stream; /* NULL: legacy default stream */
static CUevent events[64];
static int nevent;
static CUfunction fn;
static double launched_ms; /* when the last launch command began */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* This thread's CPU time and its time runnable but waiting for a CPU, in ms
 * (/proc/thread-self/schedstat; without it, CPU time alone and no wait). */
static void sched_ms(double *cpu, double *runq)
{
    unsigned long long on = 0, waited = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (f && fscanf(f, "%llu %llu", &on, &waited) == 2) {
        *cpu = on / 1e6;
        *runq = waited / 1e6;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        *cpu = ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
        *runq = 0;
    }
    if (f)
        fclose(f);
}

unsigned long long qty(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K') v *= 1024.0;
    if (*end == 'M') v *= 1048576.0;
    if (*end == 'G') v *= 1073741824.0;
    return (unsigned long long)v;
}

static CUresult need_fn(void)
{
    static CUmodule mod;
    if (fn)
        return CUDA_SUCCESS;
    CUresult rc = cuModuleLoadData(&mod, "fake image");
    return rc ? rc : cuModuleGetFunction(&fn, mod, "kernel");
}

CUresult launch_fn(CUfunction f, unsigned long long us)
{
    void *params[] = {&us};
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
}

static CUresult launch(unsigned long long us)
{
    CUresult rc = need_fn();
    return rc ? rc : launch_fn(fn, us);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *cmd = argv[i];
        const char *arg = i + 1 < argc ? argv[i + 1] : "0";
        CUresult rc = CUDA_SUCCESS;
        if (!strcmp(cmd, "init")) {
            rc = cuInit(0);
            printf("init %d\n", rc);
        } else if (!strcmp(cmd, "count")) {
            int n = -1;
            rc = cuDeviceGetCount(&n);
            printf("count %d %d\n", rc, n);
        } else if (!strcmp(cmd, "uuid")) { /* uuid <ordinal>: hex bytes */
            CUuuid u;
            i++;
            rc = cuDeviceGetUuid_v2(&u, atoi(arg));
            printf("uuid %d ", rc);
            for (int k = 0; k < 16; k++)
                printf("%02x", (unsigned char)u.bytes[k]);
            printf("\n");
        } else if (!strcmp(cmd, "name")) {
            char name[128] = "";
            i++;
            rc = cuDeviceGetName(name, sizeof name, atoi(arg));
            printf("name %d %s\n", rc, name);
        } else if (!strcmp(cmd, "primary")) { /* retain + make current */
            CUcontext c = NULL;
            i++;
            rc = cuDevicePrimaryCtxRetain(&c, atoi(arg));
            if (!rc)
                rc = cuCtxSetCurrent(c);
            printf("primary %d\n", rc);
        } else if (!strcmp(cmd, "release")) {
            i++;
            rc = cuDevicePrimaryCtxRelease_v2(atoi(arg));
            printf("release %d\n", rc);
        } else if (!strcmp(cmd, "ctx")) {
            CUcontext c = NULL;
            i++;
            rc = cuCtxCreate_v2(&c, 0, atoi(arg));
            if (!rc)
                ctxs[nctx++] = c;
            printf("ctx %d\n", rc);
        } else if (!strcmp(cmd, "bctx")) { /* a context whose synchronizes block */
            CUcontext c = NULL;
            i++;
            rc = cuCtxCreate_v2(&c, CU_CTX_SCHED_BLOCKING_SYNC, atoi(arg));
            if (!rc)
                ctxs[nctx++] = c;
            printf("bctx %d\n", rc);
        } else if (!strcmp(cmd, "destroy")) {
            rc = nctx ? cuCtxDestroy_v2(ctxs[--nctx]) : CUDA_ERROR_INVALID_CONTEXT;
            printf("destroy %d\n", rc);
        } else if (!strcmp(cmd, "alloc")) {
            CUdeviceptr p = 0;
            i++;
            rc = cuMemAlloc_v2(&p, qty(arg));
            if (!rc && nptr < MAXP)
                ptrs[nptr++] = p;
            printf("alloc %d\n", rc);
        } else if (!strcmp(cmd, "fill")) { /* alloc chunks until OOM: prints how many */
            i++;
            unsigned long long chunk = qty(arg);
            int n = 0;
            CUdeviceptr p;
            while (nptr < MAXP && (rc = cuMemAlloc_v2(&p, chunk)) == CUDA_SUCCESS) {
                ptrs[nptr++] = p;
                n++;
            }
            printf("fill %d %d\n", rc, n);
        } else if (!strcmp(cmd, "free")) {
            rc = nptr ? cuMemFree_v2(ptrs[--nptr]) : CUDA_ERROR_INVALID_VALUE;
            printf("free %d\n", rc);
        } else if (!strcmp(cmd, "freebad")) {
            rc = cuMemFree_v2(0x1234500);
            printf("freebad %d\n", rc);
        } else if (!strcmp(cmd, "info")) {
            size_t fr = 0, tot = 0;
            rc = cuMemGetInfo_v2(&fr, &tot);
            printf("info %d %zu %zu\n", rc, fr, tot);
        } else if (!strcmp(cmd, "stream")) {
            rc = cuStreamCreate(&stream, 0);
            printf("stream %d\n", rc);
        } else if (!strcmp(cmd, "launch")) { /* launch <N> <us>: prints ms spent launching */
            int n = atoi(arg);
            unsigned long long us = qty(i + 2 < argc ? argv[i + 2] : "0");
            i += 2;
            double t0 = launched_ms = now_ms();
            for (int k = 0; k < n && rc == CUDA_SUCCESS; k++)
                rc = launch(us);
            printf("launch %d %.1f\n", rc, now_ms() - t0);
        } else if (!strcmp(cmd, "event")) { /* records a new event on the current stream */
            CUevent e = NULL;
            rc = nevent < 64 ? cuEventCreate(&e, 0) : CUDA_ERROR_INVALID_VALUE;
            if (!rc)
                rc = cuEventRecord(e, stream);
            if (!rc)
                events[nevent++] = e;
            printf("event %d\n", rc);
        } else if (!strcmp(cmd, "elapsed")) { /* waits for the last event: ms since the one before */
            float ms = 0;
            rc = nevent < 2 ? CUDA_ERROR_INVALID_VALUE : cuEventSynchronize(events[nevent - 1]);
            if (!rc)
                rc = cuEventElapsedTime_v2(&ms, events[nevent - 2], events[nevent - 1]);
            printf("elapsed %d %.3f\n", rc, ms);
        } else if (!strcmp(cmd, "sync")) { /* prints ms spent waiting, and ms since the last launch began */
            double t0 = now_ms();
            rc = stream ? cuStreamSynchronize(stream) : cuCtxSynchronize();
            double t1 = now_ms();
            printf("sync %d %.1f %.1f\n", rc, t1 - t0, t1 - launched_ms);
        } else if (!strcmp(cmd, "sched")) { /* ms on a CPU so far, and ms runnable waiting for one */
            double cpu, runq;
            sched_ms(&cpu, &runq);
            printf("sched 0 %.3f %.3f\n", cpu, runq);
        } else if (!strcmp(cmd, "fork")) { /* fork <size>: the child starts over and allocates */
            i++;
            pid_t pid = fork();
            if (pid == 0) {
                CUcontext c = NULL;
                CUdeviceptr p = 0;
                size_t fr = 0, tot = 0;
                rc = cuMemAlloc_v2(&p, 1); /* the parent's context is not the child's */
                printf("child-stale %d\n", rc);
                rc = cuInit(0);
                if (!rc)
                    rc = cuDevicePrimaryCtxRetain(&c, 0);
                if (!rc)
                    rc = cuCtxSetCurrent(c);
                if (!rc)
                    rc = cuMemAlloc_v2(&p, qty(arg));
                if (!rc)
                    rc = cuMemGetInfo_v2(&fr, &tot);
                printf("child %d %zu\n", rc, fr);
                exit(0);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            printf("fork %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        } else if (!strcmp(cmd, "ready")) { /* tell the test we are here, wait for stdin */
            char line[16];
            printf("ready %d %d\n", 0, (int)getpid());
            if (!fgets(line, sizeof line, stdin))
                line[0] = '\0';
        } else if (!strcmp(cmd, "sleep")) {
            i++;
            usleep((useconds_t)(atof(arg) * 1000));
        } else if (!sim_tool_mem(argc, argv, &i)) {
            fprintf(stderr, "sim_tool: unknown command %s\n", cmd);
            return 2;
        }
    }
    return 0;
}
