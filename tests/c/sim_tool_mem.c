/* sim_tool's commands for what the driver holds beyond the pointers: pools,
 * local memory and limits, modules, graph memory, sharing, and `mem`, this
 * process's physical use as the simulator books it. Each prints one line
 * "<cmd> <CUresult> [values]" like the others. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_tool.h"
#include "vcudasim.h"

static CUmemoryPool pool;  /* the pool palloc/pattr/... work on */
static CUmodule mod;       /* the last module or library loaded */
static int mod_is_library;
static CUfunction fn;      /* the last function looked up */
static CUgraph graph;
static CUgraphExec exec;
static CUmemGenericAllocationHandle vmm; /* the last VMM handle created or imported */
static CUdeviceptr vmm_va;
static size_t vmm_size;

static const char *arg_at(int argc, char **argv, int *i)
{
    return ++*i < argc ? argv[*i] : "0";
}

static void push(CUdeviceptr p)
{
    if (nptr < MAXP)
        ptrs[nptr++] = p;
}

static CUdeviceptr take(int index)
{
    CUdeviceptr p = index >= 0 && index < nptr ? ptrs[index] : 0;
    if (p)
        ptrs[index] = 0;
    return p;
}

/* Physical use of this process on device 0, by VCUDASIM_MEM_*. */
static int print_mem(void)
{
    vcudasim_state *st = vcudasim_open(NULL, 0);
    vcudasim_process procs[64];
    int n = st ? vcudasim_processes(st, 0, procs, 64) : -1;
    vcudasim_process me = {.pid = (int32_t)getpid()};
    for (int k = 0; k < n && k < 64; k++)
        if (procs[k].pid == me.pid)
            me = procs[k];
    vcudasim_close(st);
    printf("mem %d %llu", n < 0, (unsigned long long)me.used);
    for (int k = 0; k < 7; k++)
        printf(" %llu", (unsigned long long)me.mem[k]);
    printf(" %d\n", me.host_pid);
    return 1;
}

static CUresult pool_attr(CUmemPool_attribute a, cuuint64_t *v)
{
    return cuMemPoolGetAttribute(pool, a, v);
}

static int limit_of(const char *name)
{
    static const char *names[] = {"stack", "fifo", "heap", "syncdepth", "pending", "l2fetch",
                                  "l2persist", "shmem", "cig", "cigfallback"};
    for (int k = 0; k < (int)(sizeof names / sizeof names[0]); k++)
        if (!strcmp(names[k], name))
            return k;
    return 99;
}

static int pools(const char *cmd, int argc, char **argv, int *i)
{
    CUresult rc;
    CUdeviceptr p = 0;
    cuuint64_t v[5] = {0};
    if (!strcmp(cmd, "pool")) { /* pool default | pool create [maxSize] */
        const char *what = arg_at(argc, argv, i);
        if (!strcmp(what, "create")) {
            CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0},
                                    .maxSize = qty(arg_at(argc, argv, i))};
            rc = cuMemPoolCreate(&pool, &props);
        } else {
            rc = cuDeviceGetDefaultMemPool(&pool, 0);
        }
        printf("pool %d\n", rc);
    } else if (!strcmp(cmd, "setpool")) {
        printf("setpool %d\n", cuDeviceSetMemPool(0, pool));
    } else if (!strcmp(cmd, "getpool")) { /* prints 1 when the current pool is `pool` */
        CUmemoryPool cur = NULL;
        rc = cuDeviceGetMemPool(&cur, 0);
        printf("getpool %d %d\n", rc, cur == pool);
    } else if (!strcmp(cmd, "aalloc") || !strcmp(cmd, "palloc")) { /* prints its index */
        unsigned long long size = qty(arg_at(argc, argv, i));
        rc = cmd[0] == 'a' ? cuMemAllocAsync(&p, size, stream)
                           : cuMemAllocFromPoolAsync(&p, size, pool, stream);
        if (!rc)
            push(p);
        printf("%s %d %d\n", cmd, rc, rc ? -1 : nptr - 1);
    } else if (!strcmp(cmd, "afree") || !strcmp(cmd, "mfree")) { /* by index */
        p = take(atoi(arg_at(argc, argv, i)));
        rc = cmd[0] == 'a' ? cuMemFreeAsync(p, stream) : cuMemFree_v2(p);
        printf("%s %d\n", cmd, rc);
    } else if (!strcmp(cmd, "pattr")) { /* threshold reserved reserved_high used used_high */
        rc = pool_attr(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v[0]);
        for (int k = 1; k < 5 && !rc; k++)
            rc = pool_attr((CUmemPool_attribute)(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD + k), &v[k]);
        printf("pattr %d %llu %llu %llu %llu %llu\n", rc, (unsigned long long)v[0],
               (unsigned long long)v[1], (unsigned long long)v[2], (unsigned long long)v[3],
               (unsigned long long)v[4]);
    } else if (!strcmp(cmd, "threshold")) { /* bytes or max */
        const char *a = arg_at(argc, argv, i);
        v[0] = !strcmp(a, "max") ? UINT64_MAX : qty(a);
        printf("threshold %d\n", cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, v));
    } else if (!strcmp(cmd, "resethigh")) {
        rc = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, v);
        if (!rc)
            rc = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, v);
        printf("resethigh %d\n", rc);
    } else if (!strcmp(cmd, "ptrim")) {
        printf("ptrim %d\n", cuMemPoolTrimTo(pool, qty(arg_at(argc, argv, i))));
    } else if (!strcmp(cmd, "pdestroy")) {
        printf("pdestroy %d\n", cuMemPoolDestroy(pool));
    } else if (!strcmp(cmd, "ssync")) {
        printf("ssync %d\n", cuStreamSynchronize(stream));
    } else {
        return 0;
    }
    return 1;
}

static int modules(const char *cmd, int argc, char **argv, int *i)
{
    CUresult rc;
    int v = -1;
    size_t sv = 0;
    if (!strcmp(cmd, "module") || !strcmp(cmd, "library")) { /* <image text> */
        const char *image = arg_at(argc, argv, i);
        mod_is_library = cmd[0] == 'l';
        rc = mod_is_library ? cuLibraryLoadData((CUlibrary *)&mod, image, NULL, NULL, 0, NULL,
                                                NULL, 0)
                            : cuModuleLoadData(&mod, image);
        printf("%s %d\n", cmd, rc);
    } else if (!strcmp(cmd, "modfile")) { /* <path> */
        rc = cuModuleLoad(&mod, arg_at(argc, argv, i));
        mod_is_library = 0;
        printf("modfile %d\n", rc);
    } else if (!strcmp(cmd, "fn")) { /* <name>: prints CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES */
        const char *name = arg_at(argc, argv, i);
        if (mod_is_library) {
            CUkernel k = NULL;
            rc = cuLibraryGetKernel(&k, (CUlibrary)mod, name);
            if (!rc)
                rc = cuKernelGetAttribute(&v, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, k, 0);
            fn = (CUfunction)k;
        } else {
            rc = cuModuleGetFunction(&fn, mod, name);
            if (!rc)
                rc = cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn);
        }
        printf("fn %d %d\n", rc, v);
    } else if (!strcmp(cmd, "run")) { /* [us]: launches the last function */
        printf("run %d\n", launch_fn(fn, qty(arg_at(argc, argv, i))));
    } else if (!strcmp(cmd, "unload")) {
        rc = mod_is_library ? cuLibraryUnload((CUlibrary)mod) : cuModuleUnload(mod);
        printf("unload %d\n", rc);
    } else if (!strcmp(cmd, "setlimit")) { /* <name> <value> */
        int which = limit_of(arg_at(argc, argv, i));
        printf("setlimit %d\n", cuCtxSetLimit((CUlimit)which, qty(arg_at(argc, argv, i))));
    } else if (!strcmp(cmd, "getlimit")) { /* <name> */
        rc = cuCtxGetLimit(&sv, (CUlimit)limit_of(arg_at(argc, argv, i)));
        printf("getlimit %d %zu\n", rc, sv);
    } else if (!strcmp(cmd, "attr")) { /* <CUdevice_attribute number> */
        rc = cuDeviceGetAttribute(&v, (CUdevice_attribute)atoi(arg_at(argc, argv, i)), 0);
        printf("attr %d %d\n", rc, v);
    } else {
        return 0;
    }
    return 1;
}

/* Another thread synchronizes a stream of its own in capture interaction mode `mode`. */
struct other_sync {
    CUcontext ctx;
    CUstreamCaptureMode mode;
    CUresult rc;
};

static void *other_sync_main(void *arg)
{
    struct other_sync *o = arg;
    CUstreamCaptureMode mode = o->mode;
    CUstream own = NULL;
    o->rc = cuCtxSetCurrent(o->ctx);
    if (!o->rc)
        o->rc = cuThreadExchangeStreamCaptureMode(&mode);
    if (!o->rc)
        o->rc = cuStreamCreate(&own, 0);
    if (!o->rc)
        o->rc = cuStreamSynchronize(own);
    return NULL;
}

static int graphs(const char *cmd, int argc, char **argv, int *i)
{
    CUresult rc;
    CUdeviceptr p = 0;
    if (!strcmp(cmd, "capture")) {
        printf("capture %d\n", cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    } else if (!strcmp(cmd, "mcapture")) { /* <mode>: 0 global, 1 thread-local, 2 relaxed */
        printf("mcapture %d\n", cuStreamBeginCapture_v2(stream, (CUstreamCaptureMode)atoi(arg_at(argc, argv, i))));
    } else if (!strcmp(cmd, "capmode")) { /* <mode>: this thread's interaction mode; prints the old one */
        CUstreamCaptureMode mode = (CUstreamCaptureMode)atoi(arg_at(argc, argv, i));
        rc = cuThreadExchangeStreamCaptureMode(&mode);
        printf("capmode %d %d\n", rc, (int)mode);
    } else if (!strcmp(cmd, "ctxsync")) {
        printf("ctxsync %d\n", cuCtxSynchronize());
    } else if (!strcmp(cmd, "othersync")) { /* <mode>: a new thread in that mode synchronizes its stream */
        struct other_sync o = {.mode = (CUstreamCaptureMode)atoi(arg_at(argc, argv, i))};
        pthread_t t;
        rc = cuCtxGetCurrent(&o.ctx);
        if (!rc && pthread_create(&t, NULL, other_sync_main, &o) == 0) {
            pthread_join(t, NULL);
            rc = o.rc;
        }
        printf("othersync %d\n", rc);
    } else if (!strcmp(cmd, "endcapture")) {
        printf("endcapture %d\n", cuStreamEndCapture(stream, &graph));
    } else if (!strcmp(cmd, "gcreate")) {
        printf("gcreate %d\n", cuGraphCreate(&graph, 0));
    } else if (!strcmp(cmd, "galloc")) { /* <size>: an alloc node; prints its index */
        CUgraphNode node;
        CUDA_MEM_ALLOC_NODE_PARAMS np = {
            .poolProps = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}},
            .bytesize = qty(arg_at(argc, argv, i))};
        rc = cuGraphAddMemAllocNode(&node, graph, NULL, 0, &np);
        if (!rc)
            push(np.dptr);
        printf("galloc %d %d\n", rc, rc ? -1 : nptr - 1);
    } else if (!strcmp(cmd, "gfree")) { /* <index>: a free node */
        CUgraphNode node;
        int k = atoi(arg_at(argc, argv, i));
        p = k >= 0 && k < nptr ? ptrs[k] : 0;
        printf("gfree %d\n", cuGraphAddMemFreeNode(&node, graph, NULL, 0, p));
    } else if (!strcmp(cmd, "instantiate")) {
        printf("instantiate %d\n", cuGraphInstantiateWithFlags(&exec, graph, 0));
    } else if (!strcmp(cmd, "upload")) {
        printf("upload %d\n", cuGraphUpload(exec, stream));
    } else if (!strcmp(cmd, "glaunch")) {
        printf("glaunch %d\n", cuGraphLaunch(exec, stream));
    } else if (!strcmp(cmd, "execdestroy")) {
        printf("execdestroy %d\n", cuGraphExecDestroy(exec));
    } else if (!strcmp(cmd, "gdestroy")) {
        printf("gdestroy %d\n", cuGraphDestroy(graph));
    } else if (!strcmp(cmd, "gtrim")) {
        printf("gtrim %d\n", cuDeviceGraphMemTrim(0));
    } else if (!strcmp(cmd, "gattr")) { /* used used_high reserved reserved_high */
        cuuint64_t v[4] = {0};
        rc = CUDA_SUCCESS;
        for (int k = 0; k < 4 && !rc; k++)
            rc = cuDeviceGetGraphMemAttribute(0, (CUgraphMem_attribute)k, &v[k]);
        printf("gattr %d %llu %llu %llu %llu\n", rc, (unsigned long long)v[0],
               (unsigned long long)v[1], (unsigned long long)v[2], (unsigned long long)v[3]);
    } else {
        return 0;
    }
    return 1;
}

static int sharing(const char *cmd, int argc, char **argv, int *i)
{
    CUresult rc;
    CUdeviceptr p = 0;
    if (!strcmp(cmd, "ipcget")) { /* the last allocation's handle, in hex */
        CUipcMemHandle h;
        rc = cuIpcGetMemHandle(&h, nptr ? ptrs[nptr - 1] : 0);
        printf("ipcget %d ", rc);
        for (int k = 0; k < CU_IPC_HANDLE_SIZE; k++)
            printf("%02x", (unsigned char)h.reserved[k]);
        printf("\n");
    } else if (!strcmp(cmd, "ipcopen")) { /* <hex> */
        CUipcMemHandle h = {{0}};
        const char *hex = arg_at(argc, argv, i);
        for (int k = 0; k < CU_IPC_HANDLE_SIZE && hex[2 * k] && hex[2 * k + 1]; k++) {
            unsigned b;
            sscanf(hex + 2 * k, "%2x", &b);
            h.reserved[k] = (char)b;
        }
        rc = cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (!rc)
            push(p);
        printf("ipcopen %d\n", rc);
    } else if (!strcmp(cmd, "ipcclose")) { /* the last pointer opened */
        printf("ipcclose %d\n", cuIpcCloseMemHandle(nptr ? ptrs[--nptr] : 0));
    } else if (!strcmp(cmd, "export")) { /* <size>: cuMemCreate + map; prints the fd */
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                    .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
        int fd = -1;
        vmm_size = qty(arg_at(argc, argv, i));
        rc = cuMemCreate(&vmm, vmm_size, &prop, 0);
        if (!rc)
            rc = cuMemExportToShareableHandle(&fd, vmm, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        printf("export %d %d\n", rc, fd);
    } else if (!strcmp(cmd, "import")) { /* <pid> <fd> <size>: through /proc/<pid>/fd */
        char path[64];
        int pid = atoi(arg_at(argc, argv, i)), efd = atoi(arg_at(argc, argv, i));
        snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, efd);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        rc = fd < 0 ? CUDA_ERROR_INVALID_VALUE
                    : cuMemImportFromShareableHandle(&vmm, (void *)(intptr_t)fd,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (fd >= 0)
            close(fd);
        vmm_size = qty(arg_at(argc, argv, i));
        printf("import %d\n", rc);
    } else if (!strcmp(cmd, "vmap")) { /* maps the last handle (vmm_size bytes) */
        rc = cuMemAddressReserve(&vmm_va, vmm_size, 0, 0, 0);
        if (!rc)
            rc = cuMemMap(vmm_va, vmm_size, 0, vmm, 0);
        printf("vmap %d\n", rc);
    } else if (!strcmp(cmd, "vrelease")) { /* unmaps (if mapped) and releases the handle */
        if (vmm_va)
            cuMemUnmap(vmm_va, vmm_size);
        vmm_va = 0;
        printf("vrelease %d\n", cuMemRelease(vmm));
    } else {
        return 0;
    }
    return 1;
}

int sim_tool_mem(int argc, char **argv, int *i)
{
    const char *cmd = argv[*i];
    if (!strcmp(cmd, "mem"))
        return print_mem();
    return pools(cmd, argc, argv, i) || modules(cmd, argc, argv, i) ||
           graphs(cmd, argc, argv, i) || sharing(cmd, argc, argv, i);
}
