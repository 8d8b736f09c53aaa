/* cuprobe: drives the CUDA driver API the way applications do, for the shim's
 * tests. Entry points come from one of three doors:
 *   --via=link   the program is linked against the driver (built with -DVIA_LINK)
 *   --via=dlsym  dlopen($VCUDA_REAL_LIBCUDA) + dlsym, like old runtimes
 *   --via=proc   only cuGetProcAddress_v2 is dlsym'd; everything else, even
 *                cuGetProcAddress itself, comes through it, like cudart 12/13
 *                (--cuda-version=N, --ptds for the per-thread-stream flag)
 * then runs the commands on its command line, printing one line each:
 *   "<command> rc=<CUresult> [key=value...]". See tests/libvcuda for usage.
 * With --stdin it then reads more commands from stdin, one per line, and
 * ends each command's output with a line "--", so a test can look at the
 * simulator and the ledger between any two steps. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdbool.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vcuda/cuda_abi.h"

typedef CUresult (*getproc_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*getproc_v1_fn)(const char *, void **, int, cuuint64_t);

static struct {
    CUresult (*init)(unsigned);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_create_v2)(CUcontext *, unsigned, CUdevice);
    CUresult (*ctx_create_v4)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*mem_alloc_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*mem_free_async)(CUdeviceptr, CUstream);
    CUresult (*default_pool)(CUmemoryPool *, CUdevice);
    CUresult (*stream_sync)(CUstream);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*array_create)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*array3d_create)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*array_destroy)(CUarray);
    CUresult (*mipmap_create)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
    CUresult (*mipmap_destroy)(CUmipmappedArray);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*total_mem)(size_t *, CUdevice);
    CUresult (*module_load)(CUmodule *, const void *);
    CUresult (*module_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **);
    CUresult (*ctx_sync)(void);
    /* pools, local memory, graphs, sharing (issue 12) */
    CUresult (*pool_create)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*pool_destroy)(CUmemoryPool);
    CUresult (*pool_trim)(CUmemoryPool, size_t);
    CUresult (*pool_set_attr)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*pool_get_attr)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*set_mem_pool)(CUdevice, CUmemoryPool);
    CUresult (*ctx_set_limit)(CUlimit, size_t);
    CUresult (*ctx_get_limit)(size_t *, CUlimit);
    CUresult (*library_load)(CUlibrary *, const void *, CUjit_option *, void **, unsigned, CUlibraryOption *, void **,
                             unsigned);
    CUresult (*library_kernel)(CUkernel *, CUlibrary, const char *);
    CUresult (*kernel_function)(CUfunction *, CUkernel);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
    CUresult (*end_capture)(CUstream, CUgraph *);
    CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    /* what cuGraphInstantiate is below 12000 (cuGraphInstantiate_v2), in the getProcAddress door */
    CUresult (*graph_instantiate_v2)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
    CUresult (*graph_upload)(CUgraphExec, CUstream);
    CUresult (*graph_exec_destroy)(CUgraphExec);
    CUresult (*graph_destroy)(CUgraph);
    CUresult (*graph_create)(CUgraph *, unsigned);
    CUresult (*graph_add_alloc)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
    CUresult (*graph_mem_trim)(CUdevice);
    CUresult (*graph_mem_attr)(CUdevice, CUgraphMem_attribute, void *);
    CUresult (*export_handle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long);
    CUresult (*import_handle)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*ipc_get)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned);
    /* the legacy ABIs (see LEGACY) */
    CUresult (*legacy_begin_capture)(CUstream);
    CUresult (*legacy_instantiate)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
    CUresult (*legacy_release)(CUdevice);
    CUresult (*legacy_reset)(CUdevice);
    /* devices, for `devs`: looked up through the same door, not printed */
    CUresult (*device_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_uuid)(CUuuid *, CUdevice);
} cu;

/* name in the driver (dlsym door), base name (getProcAddress door), slot */
#define ENTRIES(X)                                                               \
    X("cuInit", "cuInit", init)                                                  \
    X("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", primary_retain)     \
    X("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", primary_release) \
    X("cuCtxSetCurrent", "cuCtxSetCurrent", ctx_set_current)                     \
    X("cuCtxDestroy_v2", "cuCtxDestroy", ctx_destroy)                            \
    X("cuMemAlloc_v2", "cuMemAlloc", mem_alloc)                                  \
    X("cuMemAllocPitch_v2", "cuMemAllocPitch", mem_alloc_pitch)                  \
    X("cuMemFree_v2", "cuMemFree", mem_free)                                     \
    X("cuMemAllocManaged", "cuMemAllocManaged", mem_alloc_managed)               \
    X("cuMemAllocAsync", "cuMemAllocAsync", mem_alloc_async)                     \
    X("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", mem_alloc_pool)      \
    X("cuMemFreeAsync", "cuMemFreeAsync", mem_free_async)                        \
    X("cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool", default_pool)    \
    X("cuStreamSynchronize", "cuStreamSynchronize", stream_sync)                 \
    X("cuMemCreate", "cuMemCreate", mem_create)                                  \
    X("cuMemRelease", "cuMemRelease", mem_release)                               \
    X("cuArrayCreate_v2", "cuArrayCreate", array_create)                         \
    X("cuArray3DCreate_v2", "cuArray3DCreate", array3d_create)                   \
    X("cuArrayDestroy", "cuArrayDestroy", array_destroy)                         \
    X("cuMipmappedArrayCreate", "cuMipmappedArrayCreate", mipmap_create)         \
    X("cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", mipmap_destroy)      \
    X("cuMemGetInfo_v2", "cuMemGetInfo", mem_get_info)                           \
    X("cuDeviceTotalMem_v2", "cuDeviceTotalMem", total_mem)                      \
    X("cuModuleLoadData", "cuModuleLoadData", module_load)                       \
    X("cuModuleGetFunction", "cuModuleGetFunction", module_function)             \
    X("cuLaunchKernel", "cuLaunchKernel", launch)                                \
    X("cuCtxSynchronize", "cuCtxSynchronize", ctx_sync)                          \
    X("cuMemPoolCreate", "cuMemPoolCreate", pool_create)                         \
    X("cuMemPoolDestroy", "cuMemPoolDestroy", pool_destroy)                      \
    X("cuMemPoolTrimTo", "cuMemPoolTrimTo", pool_trim)                           \
    X("cuMemPoolSetAttribute", "cuMemPoolSetAttribute", pool_set_attr)           \
    X("cuMemPoolGetAttribute", "cuMemPoolGetAttribute", pool_get_attr)           \
    X("cuDeviceSetMemPool", "cuDeviceSetMemPool", set_mem_pool)                  \
    X("cuCtxSetLimit", "cuCtxSetLimit", ctx_set_limit)                           \
    X("cuCtxGetLimit", "cuCtxGetLimit", ctx_get_limit)                           \
    X("cuLibraryLoadData", "cuLibraryLoadData", library_load)                    \
    X("cuLibraryGetKernel", "cuLibraryGetKernel", library_kernel)                \
    X("cuKernelGetFunction", "cuKernelGetFunction", kernel_function)             \
    X("cuStreamCreate", "cuStreamCreate", stream_create)                         \
    X("cuStreamBeginCapture_v2", "cuStreamBeginCapture", begin_capture)          \
    X("cuStreamEndCapture", "cuStreamEndCapture", end_capture)                   \
    X("cuGraphInstantiateWithFlags", "cuGraphInstantiate", graph_instantiate)    \
    X("cuGraphLaunch", "cuGraphLaunch", graph_launch)                            \
    X("cuGraphUpload", "cuGraphUpload", graph_upload)                            \
    X("cuGraphExecDestroy", "cuGraphExecDestroy", graph_exec_destroy)            \
    X("cuGraphDestroy", "cuGraphDestroy", graph_destroy)                         \
    X("cuGraphCreate", "cuGraphCreate", graph_create)                            \
    X("cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode", graph_add_alloc)       \
    X("cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim", graph_mem_trim)            \
    X("cuDeviceGetGraphMemAttribute", "cuDeviceGetGraphMemAttribute", graph_mem_attr) \
    X("cuMemExportToShareableHandle", "cuMemExportToShareableHandle", export_handle) \
    X("cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", import_handle) \
    X("cuMemAddressReserve", "cuMemAddressReserve", address_reserve)             \
    X("cuMemMap", "cuMemMap", mem_map)                                           \
    X("cuMemSetAccess", "cuMemSetAccess", mem_set_access)                        \
    X("cuIpcGetMemHandle", "cuIpcGetMemHandle", ipc_get)                         \
    X("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", ipc_open)

/* The legacy (unsuffixed) ABIs a driver hands out for a base name asked for
 * below the version its _v2 appeared in: name in the driver (the second with
 * --ptds), base name, the cudaVersion the getProcAddress door asks with (its
 * own cuGetProcAddress: the 4-argument one below 12000), slot. Each resolves
 * to a "legacy" line whose `same` says whether it is what dlsym of that name
 * gives (under the shim: the wrapper of exactly that ABI). */
#define LEGACY(X)                                                                                         \
    X("cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture", 10000, legacy_begin_capture) \
    X("cuGraphInstantiate", "cuGraphInstantiate", "cuGraphInstantiate", 10000, legacy_instantiate)          \
    X("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease", 10020,          \
      legacy_release)                                                                                     \
    X("cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset", 10020, legacy_reset)

#ifdef VIA_LINK
/* Declared by their driver names, typed later through the table's slots. */
typedef void (*any_fn)(void);
#define DECLARE(name, base, slot) extern void link_##slot(void) __asm__(name);
ENTRIES(DECLARE)
extern void link_ctx_create_v2(void) __asm__("cuCtxCreate_v2");
extern void link_ctx_create_v4(void) __asm__("cuCtxCreate_v4");
extern void link_device_count(void) __asm__("cuDeviceGetCount");
extern void link_device_get(void) __asm__("cuDeviceGet");
extern void link_device_uuid(void) __asm__("cuDeviceGetUuid_v2");
#define DECLARE_LEGACY(name, ptsz_name, base, version, slot) extern void link_##slot(void) __asm__(name);
LEGACY(DECLARE_LEGACY)
#endif

static int cuda_version = 13000;
static int ptds = 0;

static void where(const char *name, void *fn) {
    Dl_info info;
    const char *lib = "?";
    if (fn && dladdr(fn, &info) && info.dli_fname) {
        lib = strrchr(info.dli_fname, '/');
        lib = lib ? lib + 1 : info.dli_fname;
    }
    printf("resolve name=%s lib=%s\n", name, fn ? lib : "(null)");
}

/* A legacy entry point `fn` that should be the driver's `name`: where it
 * lives, and whether dlsym(h, name) gives the same address. */
static void legacy_where(void *h, const char *name, void *fn) {
    Dl_info info;
    const char *lib = "(null)";
    if (fn && dladdr(fn, &info) && info.dli_fname) {
        lib = strrchr(info.dli_fname, '/');
        lib = lib ? lib + 1 : info.dli_fname;
    }
    printf("legacy name=%s lib=%s same=%d\n", name, lib, fn != NULL && fn == dlsym(h, name));
}

static int resolve(const char *via) {
#ifdef VIA_LINK
    if (strcmp(via, "link") == 0) {
#define ASSIGN(name, base, slot) memcpy(&cu.slot, &(any_fn){link_##slot}, sizeof(any_fn));
        ENTRIES(ASSIGN)
        memcpy(&cu.ctx_create_v2, &(any_fn){link_ctx_create_v2}, sizeof(any_fn));
        memcpy(&cu.device_count, &(any_fn){link_device_count}, sizeof(any_fn));
        memcpy(&cu.device_get, &(any_fn){link_device_get}, sizeof(any_fn));
        memcpy(&cu.device_uuid, &(any_fn){link_device_uuid}, sizeof(any_fn));
#define ASSIGN_LEGACY(name, ptsz_name, base, version, slot) ASSIGN(name, base, slot)
        LEGACY(ASSIGN_LEGACY)
        return 0;
    }
#endif
    const char *path = getenv("VCUDA_REAL_LIBCUDA");
    void *h = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    if (strcmp(via, "dlsym") == 0) {
#define BY_DLSYM(name, base, slot) { void *p = dlsym(h, name); memcpy(&cu.slot, &p, sizeof p); where(name, p); }
        ENTRIES(BY_DLSYM)
        void *p = dlsym(h, "cuCtxCreate_v2");
        memcpy(&cu.ctx_create_v2, &p, sizeof p);
        where("cuCtxCreate_v2", p);
        void *dc = dlsym(h, "cuDeviceGetCount"), *dg = dlsym(h, "cuDeviceGet"), *du = dlsym(h, "cuDeviceGetUuid_v2");
        memcpy(&cu.device_count, &dc, sizeof dc);
        memcpy(&cu.device_get, &dg, sizeof dg);
        memcpy(&cu.device_uuid, &du, sizeof du);
#define LEGACY_BY_DLSYM(name, ptsz_name, base, version, slot)                       \
    {                                                                               \
        void *p = dlsym(h, ptds ? ptsz_name : name);                                \
        memcpy(&cu.slot, &p, sizeof p);                                             \
        legacy_where(h, ptds ? ptsz_name : name, p);                                \
    }
        LEGACY(LEGACY_BY_DLSYM)
        return 0;
    }
    /* cudart's way: one dlsym, then getProcAddress for everything, itself included. */
    getproc_v2_fn gp = (getproc_v2_fn)(uintptr_t)dlsym(h, "cuGetProcAddress_v2");
    where("cuGetProcAddress_v2", (void *)(uintptr_t)gp);
    if (!gp) return 1;
    cuuint64_t flags = ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    void *self = NULL;
    CUdriverProcAddressQueryResult st;
    gp("cuGetProcAddress", &self, cuda_version, flags, &st);
    where("cuGetProcAddress", self);
    getproc_v2_fn gp2 = cuda_version >= 12000 ? (getproc_v2_fn)(uintptr_t)self : NULL;
    getproc_v1_fn gp1 = cuda_version < 12000 ? (getproc_v1_fn)(uintptr_t)self : NULL;
#define BY_PROC(name, base, slot)                                                      \
    {                                                                                  \
        void *p = NULL;                                                                \
        CUresult r = gp2 ? gp2(base, &p, cuda_version, flags, &st) : gp1(base, &p, cuda_version, flags); \
        if (r != CUDA_SUCCESS) p = NULL;                                               \
        memcpy(&cu.slot, &p, sizeof p);                                                \
        where(base, p);                                                                \
    }
    ENTRIES(BY_PROC)
    if (cuda_version < 12000) { /* the base name means cuGraphInstantiate_v2 there, not ...WithFlags */
        memcpy(&cu.graph_instantiate_v2, &cu.graph_instantiate, sizeof cu.graph_instantiate);
        cu.graph_instantiate = NULL;
    }
    void *p = NULL;
    if (gp2) gp2("cuCtxCreate", &p, cuda_version, flags, &st);
    else gp1("cuCtxCreate", &p, cuda_version, flags);
    where("cuCtxCreate", p);
    if (cuda_version >= 13000) memcpy(&cu.ctx_create_v4, &p, sizeof p);
    else memcpy(&cu.ctx_create_v2, &p, sizeof p);
    const struct { const char *base; void *slot; } devices[] = {
        {"cuDeviceGetCount", &cu.device_count}, {"cuDeviceGet", &cu.device_get}, {"cuDeviceGetUuid", &cu.device_uuid},
    };
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        p = NULL;
        CUresult r = gp2 ? gp2(devices[i].base, &p, cuda_version, flags, &st) : gp1(devices[i].base, &p, cuda_version, flags);
        if (r != CUDA_SUCCESS) p = NULL;
        memcpy(devices[i].slot, &p, sizeof p);
    }
    /* The legacy ABIs, asked for at their old versions through the same
     * cuGetProcAddress: the 4-argument one below 12000 (as cudart 11 resolves). */
#define LEGACY_BY_PROC(name, ptsz_name, base, version, slot)                                     \
    {                                                                                            \
        p = NULL;                                                                                \
        CUresult r = gp2 ? gp2(base, &p, version, flags, &st) : gp1(base, &p, version, flags);    \
        if (r != CUDA_SUCCESS) p = NULL;                                                         \
        memcpy(&cu.slot, &p, sizeof p);                                                          \
        legacy_where(h, ptds ? ptsz_name : name, p);                                             \
    }
    LEGACY(LEGACY_BY_PROC)
    return 0;
}

/* Allocations made so far, freed by `freeall` with the matching API. */
enum kind { K_PTR, K_ASYNC, K_VMM, K_ARRAY, K_MIPMAP };
struct held { enum kind kind; uint64_t handle; };
static struct held held[65536];
static int nheld;

static void keep(enum kind kind, uint64_t handle) {
    if (nheld < (int)(sizeof held / sizeof held[0])) held[nheld++] = (struct held){kind, handle};
}

static CUresult release(const struct held *h) {
    switch (h->kind) {
    case K_PTR: return cu.mem_free(h->handle);
    case K_ASYNC: {
        CUresult r = cu.mem_free_async(h->handle, NULL);
        return r ? r : cu.stream_sync(NULL);
    }
    case K_VMM: return cu.mem_release(h->handle);
    case K_ARRAY: return cu.array_destroy((CUarray)(uintptr_t)h->handle);
    case K_MIPMAP: return cu.mipmap_destroy((CUmipmappedArray)(uintptr_t)h->handle);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static unsigned long long num(const char *s) { return strtoull(s, NULL, 0); }

/* One allocation by kind name; shared by commands and the stress threads. */
static CUresult allocate(const char *what, unsigned long long a, unsigned long long b,
                         unsigned long long c, unsigned long long d, struct held *out) {
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (strcmp(what, "alloc") == 0) {
        CUdeviceptr p = 0;
        r = cu.mem_alloc(&p, a);
        *out = (struct held){K_PTR, p};
    } else if (strcmp(what, "managed") == 0) {
        CUdeviceptr p = 0;
        r = cu.mem_alloc_managed(&p, a, CU_MEM_ATTACH_GLOBAL);
        *out = (struct held){K_PTR, p};
    } else if (strcmp(what, "pitch") == 0) {
        CUdeviceptr p = 0;
        size_t pitch = 0;
        r = cu.mem_alloc_pitch(&p, &pitch, a, b, 4);
        *out = (struct held){K_PTR, p};
    } else if (strcmp(what, "async") == 0) {
        CUdeviceptr p = 0;
        r = cu.mem_alloc_async(&p, a, NULL);
        *out = (struct held){K_ASYNC, p};
    } else if (strcmp(what, "pool") == 0) {
        CUdeviceptr p = 0;
        CUmemoryPool pool;
        r = cu.default_pool(&pool, 0);
        if (r == CUDA_SUCCESS) r = cu.mem_alloc_pool(&p, a, pool, NULL);
        *out = (struct held){K_ASYNC, p};
    } else if (strcmp(what, "vmm") == 0) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        CUmemGenericAllocationHandle h = 0;
        r = cu.mem_create(&h, a, &prop, 0);
        *out = (struct held){K_VMM, h};
    } else if (strcmp(what, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR desc = {.Width = a, .Height = b, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUarray arr = NULL;
        r = cu.array_create(&arr, &desc);
        *out = (struct held){K_ARRAY, (uint64_t)(uintptr_t)arr};
    } else if (strcmp(what, "array3d") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = a, .Height = b, .Depth = c, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUarray arr = NULL;
        r = cu.array3d_create(&arr, &desc);
        *out = (struct held){K_ARRAY, (uint64_t)(uintptr_t)arr};
    } else if (strcmp(what, "mipmap") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = a, .Height = b, .Depth = c, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUmipmappedArray arr = NULL;
        r = cu.mipmap_create(&arr, &desc, (unsigned)d);
        *out = (struct held){K_MIPMAP, (uint64_t)(uintptr_t)arr};
    }
    return r;
}

/* stress: threads allocate and free at random; each thread frees what it holds at the end. */
struct stress_arg { unsigned seed; double seconds; unsigned long long max_bytes; long ops; long denied; CUcontext ctx; };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *stress_thread(void *p) {
    struct stress_arg *arg = p;
    cu.ctx_set_current(arg->ctx);
    struct held mine[64];
    int n = 0;
    static const char *const kinds[] = {"alloc", "managed", "async", "vmm", "pitch", "array"};
    double end = now_s() + arg->seconds;
    while (now_s() < end) {
        unsigned r = rand_r(&arg->seed);
        if (n > 0 && (r % 2 == 0 || n == 64)) {
            int i = (int)(rand_r(&arg->seed) % (unsigned)n);
            release(&mine[i]);
            mine[i] = mine[--n];
        } else {
            const char *kind = kinds[rand_r(&arg->seed) % 6];
            unsigned long long bytes = 1 + rand_r(&arg->seed) % arg->max_bytes;
            if (strcmp(kind, "vmm") == 0) bytes = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
            struct held h;
            CUresult rc = allocate(kind, strcmp(kind, "array") == 0 ? bytes / 4 + 1 : bytes,
                                   strcmp(kind, "pitch") == 0 ? 2 : 1, 0, 1, &h);
            if (rc == CUDA_SUCCESS) mine[n++] = h;
            else if (rc == CUDA_ERROR_OUT_OF_MEMORY) arg->denied++;
        }
        arg->ops++;
    }
    while (n > 0) release(&mine[--n]);
    return NULL;
}

/* One thread spinning on one device's primary context ("spindevs"). */
struct spin_arg { int device; unsigned long long us, ms, every; long kernels; CUresult rc; };

static void *spin_device_thread(void *p) {
    struct spin_arg *arg = p;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUresult r = cu.primary_retain(&ctx, (CUdevice)arg->device);
    if (r == CUDA_SUCCESS) r = cu.ctx_set_current(ctx);
    if (r == CUDA_SUCCESS) r = cu.module_load(&mod, "spin");
    if (r == CUDA_SUCCESS) r = cu.module_function(&fn, mod, "spin");
    uint64_t us = arg->us;
    void *params[] = {&us};
    double end = now_s() + (double)arg->ms / 1000.0;
    while (r == CUDA_SUCCESS && now_s() < end) {
        r = cu.launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        if (r == CUDA_SUCCESS && ++arg->kernels % (long)arg->every == 0) r = cu.ctx_sync();
    }
    if (r == CUDA_SUCCESS) r = cu.ctx_sync();
    arg->rc = r;
    return NULL;
}

/* ---- pools, local memory, graphs and sharing (issue 12) ---- */

static CUmemoryPool pool;   /* "mkpool", else the default pool */
static CUmodule module;
static CUlibrary library;
static CUkernel kernel;
static CUfunction function;
static CUstream stream;     /* "stream"; captures and graph launches use it */
static CUgraph graph;
static CUgraphExec exec;
static CUdeviceptr captured[4096];
static int ncaptured;

static CUmemoryPool the_pool(void) {
    if (pool == NULL) cu.default_pool(&pool, 0);
    return pool;
}

static uint64_t pool_attr(CUmemPool_attribute attr) {
    cuuint64_t v = 0;
    cu.pool_get_attr(the_pool(), attr, &v);
    return v;
}

static uint64_t graph_attr(CUgraphMem_attribute attr) {
    cuuint64_t v = 0;
    cu.graph_mem_attr(0, attr, &v);
    return v;
}

static CUmemAllocationProp device_prop(CUmemAllocationHandleType types) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = types;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

static CUresult launch_fn(CUfunction f, uint64_t us) {
    void *params[] = {&us};
    return cu.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
}

/* Maps an allocation another process exported as fd `fd`, as NCCL peers do. */
static CUresult import_fd(pid_t pid, int fd, size_t bytes) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fd);
    int mine = open(path, O_RDWR | O_CLOEXEC);
    if (mine < 0) return CUDA_ERROR_INVALID_VALUE;
    CUmemGenericAllocationHandle h;
    CUresult r = cu.import_handle(&h, (void *)(intptr_t)mine, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUdeviceptr va = 0;
    if (r == CUDA_SUCCESS) r = cu.address_reserve(&va, bytes, 0, 0, 0);
    if (r == CUDA_SUCCESS) r = cu.mem_map(va, bytes, 0, h, 0);
    CUmemAccessDesc access = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (r == CUDA_SUCCESS) r = cu.mem_set_access(va, bytes, &access, 1);
    return r;
}

/* The commands of this section; false when `c` is none of them. */
static bool memory_command(const char *c, const char *text, unsigned long long a, unsigned long long b,
                           unsigned long long cc) {
    CUresult r;
    CUdeviceptr p = 0;
    if (strcmp(c, "mkpool") == 0) { /* a pool of device 0, made current: "mkpool:1" */
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        r = cu.pool_create(&pool, &props);
        if (r == CUDA_SUCCESS && a) r = cu.set_mem_pool(0, pool);
        printf("mkpool rc=%d\n", r);
    } else if (strcmp(c, "devmem") == 0) { /* what names device a without a context of it: VMM, pools */
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = (int)a;
        CUmemGenericAllocationHandle h = 0;
        CUresult created = cu.mem_create(&h, 2u << 20, &prop, 0);
        if (created == CUDA_SUCCESS) cu.mem_release(h);
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = (int)a;
        CUmemoryPool made = NULL, dflt = NULL;
        CUresult pooled = cu.pool_create(&made, &props);
        if (pooled == CUDA_SUCCESS) cu.pool_destroy(made);
        CUresult set = cu.default_pool(&dflt, (CUdevice)a);
        if (set == CUDA_SUCCESS) set = cu.set_mem_pool((CUdevice)a, dflt);
        printf("devmem rc=0 create=%d pool=%d setpool=%d\n", created, pooled, set);
    } else if (strcmp(c, "destroypool") == 0) {
        printf("destroypool rc=%d\n", cu.pool_destroy(the_pool()));
        pool = NULL;
    } else if (strcmp(c, "threshold") == 0) {
        cuuint64_t v = a;
        printf("threshold rc=%d\n", cu.pool_set_attr(the_pool(), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
    } else if (strcmp(c, "trim") == 0) {
        printf("trim rc=%d\n", cu.pool_trim(the_pool(), a));
    } else if (strcmp(c, "poolattr") == 0) {
        printf("poolattr rc=0 reserved=%llu used=%llu\n", (unsigned long long)pool_attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
               (unsigned long long)pool_attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    } else if (strcmp(c, "palloc") == 0) { /* from the_pool() */
        r = cu.mem_alloc_pool(&p, a, the_pool(), NULL);
        if (r == CUDA_SUCCESS) keep(K_ASYNC, p);
        printf("palloc rc=%d\n", r);
    } else if (strcmp(c, "drop") == 0) { /* frees the a-th allocation held; the last takes its place */
        r = (int)a < nheld ? release(&held[a]) : CUDA_ERROR_INVALID_VALUE;
        if ((int)a < nheld) held[a] = held[--nheld];
        printf("drop rc=%d\n", r);
    } else if (strcmp(c, "sync") == 0) {
        printf("sync rc=%d\n", cu.ctx_sync());
    } else if (strcmp(c, "mod") == 0 || strcmp(c, "lib") == 0) { /* load the image `text` */
        r = c[0] == 'm' ? cu.module_load(&module, text) : cu.library_load(&library, text, NULL, NULL, 0, NULL, NULL, 0);
        printf("%s rc=%d\n", c, r);
    } else if (strcmp(c, "func") == 0) {
        r = cu.module_function(&function, module, text);
        printf("func rc=%d\n", r);
    } else if (strcmp(c, "kernel") == 0) {
        printf("kernel rc=%d\n", cu.library_kernel(&kernel, library, text));
    } else if (strcmp(c, "kfunc") == 0) {
        printf("kfunc rc=%d\n", cu.kernel_function(&function, kernel));
    } else if (strcmp(c, "launch") == 0 || strcmp(c, "klaunch") == 0) { /* a-us kernel: the function or the kernel */
        r = launch_fn(c[0] == 'l' ? function : (CUfunction)(void *)kernel, a);
        if (r == CUDA_SUCCESS) r = cu.ctx_sync();
        printf("%s rc=%d\n", c, r);
    } else if (strcmp(c, "setlimit") == 0) {
        printf("setlimit rc=%d\n", cu.ctx_set_limit((CUlimit)a, b));
    } else if (strcmp(c, "getlimit") == 0) {
        size_t v = 0;
        r = cu.ctx_get_limit(&v, (CUlimit)a);
        printf("getlimit rc=%d value=%zu\n", r, v);
    } else if (strcmp(c, "stream") == 0) {
        printf("stream rc=%d\n", cu.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    } else if (strcmp(c, "ssync") == 0) {
        printf("ssync rc=%d\n", cu.stream_sync(stream));
    } else if (strcmp(c, "capture") == 0) {
        printf("capture rc=%d\n", cu.begin_capture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    } else if (strcmp(c, "mcapture") == 0) { /* a capture begun in mode a (0 global, 1 thread-local, 2 relaxed) */
        printf("mcapture rc=%d\n", cu.begin_capture(stream, (CUstreamCaptureMode)a));
    } else if (strcmp(c, "lcapture") == 0) { /* the legacy cuStreamBeginCapture(_ptsz): GLOBAL, no mode */
        printf("lcapture rc=%d\n", cu.legacy_begin_capture(stream));
    } else if (strcmp(c, "slaunch") == 0) { /* b kernels of a us on the stream, no synchronize */
        CUmodule mod;
        CUfunction fn;
        r = cu.module_load(&mod, "spin");
        if (r == CUDA_SUCCESS) r = cu.module_function(&fn, mod, "spin");
        uint64_t us = a;
        void *params[] = {&us};
        for (unsigned long long i = 0; r == CUDA_SUCCESS && i < b; i++)
            r = cu.launch(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
        printf("slaunch rc=%d\n", r);
    } else if (strcmp(c, "calloc") == 0) { /* an allocation on the stream: captured while it captures */
        r = cu.mem_alloc_async(&p, a, stream);
        if (r == CUDA_SUCCESS && ncaptured < 4096) captured[ncaptured++] = p;
        printf("calloc rc=%d\n", r);
    } else if (strcmp(c, "cfree") == 0) {
        printf("cfree rc=%d\n", ncaptured ? cu.mem_free_async(captured[--ncaptured], stream) : CUDA_ERROR_INVALID_VALUE);
    } else if (strcmp(c, "endcapture") == 0) {
        printf("endcapture rc=%d\n", cu.end_capture(stream, &graph));
    } else if (strcmp(c, "graphnew") == 0) {
        printf("graphnew rc=%d\n", cu.graph_create(&graph, 0));
    } else if (strcmp(c, "graphalloc") == 0) { /* an allocation node of a bytes (on device b) */
        CUDA_MEM_ALLOC_NODE_PARAMS params;
        memset(&params, 0, sizeof params);
        params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params.poolProps.location.id = (int)b;
        params.bytesize = a;
        CUgraphNode node;
        printf("graphalloc rc=%d\n", cu.graph_add_alloc(&node, graph, NULL, 0, &params));
    } else if (strcmp(c, "instantiate") == 0) { /* "instantiate:2": with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD */
        CUgraphNode error_node = NULL;
        char log[256];
        r = cu.graph_instantiate      ? cu.graph_instantiate(&exec, graph, a)
            : cu.graph_instantiate_v2 ? cu.graph_instantiate_v2(&exec, graph, &error_node, log, sizeof log)
                                      : CUDA_ERROR_NOT_FOUND;
        printf("instantiate rc=%d\n", r);
    } else if (strcmp(c, "linstantiate") == 0) { /* the legacy cuGraphInstantiate (the parameters of _v2) */
        CUgraphNode error_node = NULL;
        char log[256];
        printf("linstantiate rc=%d\n", cu.legacy_instantiate(&exec, graph, &error_node, log, sizeof log));
    } else if (strcmp(c, "glaunch") == 0) {
        r = cu.graph_launch(exec, stream);
        if (r == CUDA_SUCCESS) r = cu.stream_sync(stream);
        printf("glaunch rc=%d\n", r);
    } else if (strcmp(c, "gupload") == 0) {
        printf("gupload rc=%d\n", cu.graph_upload(exec, stream));
    } else if (strcmp(c, "execdestroy") == 0) {
        printf("execdestroy rc=%d\n", cu.graph_exec_destroy(exec));
    } else if (strcmp(c, "graphdestroy") == 0) {
        printf("graphdestroy rc=%d\n", cu.graph_destroy(graph));
    } else if (strcmp(c, "graphtrim") == 0) {
        printf("graphtrim rc=%d\n", cu.graph_mem_trim(0));
    } else if (strcmp(c, "graphattr") == 0) {
        printf("graphattr rc=0 used=%llu reserved=%llu\n", (unsigned long long)graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
               (unsigned long long)graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
    } else if (strcmp(c, "vmmexport") == 0) { /* a bytes of VMM memory, exported as a file descriptor */
        CUmemAllocationProp prop = device_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        CUmemGenericAllocationHandle h = 0;
        int fd = -1;
        r = cu.mem_create(&h, a, &prop, 0);
        if (r == CUDA_SUCCESS) keep(K_VMM, h);
        if (r == CUDA_SUCCESS) r = cu.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        printf("vmmexport rc=%d fd=%d pid=%d\n", r, fd, (int)getpid());
    } else if (strcmp(c, "import") == 0) { /* import:<pid>:<fd>:<bytes> */
        printf("import rc=%d\n", import_fd((pid_t)a, (int)b, cc));
    } else if (strcmp(c, "ipcget") == 0) { /* the IPC handle of the last cuMemAlloc, in hex */
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        r = nheld ? cu.ipc_get(&h, held[nheld - 1].handle) : CUDA_ERROR_INVALID_VALUE;
        printf("ipcget rc=%d handle=", r);
        for (size_t i = 0; i < sizeof h.reserved; i++) printf("%02x", (unsigned char)h.reserved[i]);
        printf("\n");
    } else if (strcmp(c, "ipcopen") == 0) {
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        for (size_t i = 0; i < sizeof h.reserved && text && text[2 * i] && text[2 * i + 1]; i++) {
            unsigned v = 0;
            sscanf(text + 2 * i, "%2x", &v);
            h.reserved[i] = (char)v;
        }
        printf("ipcopen rc=%d\n", cu.ipc_open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    } else {
        return false;
    }
    return true;
}

static CUcontext ctx;

/* Runs one command, printing its line(s). */
static void run_command(const char *arg) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s", arg);
    char *args[6] = {0};
    int nargs = 0;
    for (char *save = NULL, *tok = strtok_r(cmd, ":", &save); tok && nargs < 6; tok = strtok_r(NULL, ":", &save))
        args[nargs++] = tok;
    const char *c = args[0];
    unsigned long long a = nargs > 1 ? num(args[1]) : 0, b = nargs > 2 ? num(args[2]) : 0;
    unsigned long long cc = nargs > 3 ? num(args[3]) : 0, d = nargs > 4 ? num(args[4]) : 0;
    CUresult r;
    if (strcmp(c, "init") == 0) {
        printf("init rc=%d\n", cu.init(0));
    } else if (strcmp(c, "ctx") == 0) {
        r = cu.primary_retain(&ctx, (CUdevice)a);
        if (r == CUDA_SUCCESS) r = cu.ctx_set_current(ctx);
        printf("ctx rc=%d\n", r);
    } else if (strcmp(c, "release") == 0) {
        printf("release rc=%d\n", cu.primary_release((CUdevice)a));
    } else if (strcmp(c, "lrelease") == 0) { /* the legacy cuDevicePrimaryCtxRelease */
        printf("lrelease rc=%d\n", cu.legacy_release((CUdevice)a));
    } else if (strcmp(c, "lreset") == 0) { /* the legacy cuDevicePrimaryCtxReset */
        printf("lreset rc=%d\n", cu.legacy_reset((CUdevice)a));
    } else if (strcmp(c, "newctx") == 0) {
        r = cu.ctx_create_v4 ? cu.ctx_create_v4(&ctx, NULL, 0, (CUdevice)a) : cu.ctx_create_v2(&ctx, 0, (CUdevice)a);
        printf("newctx rc=%d\n", r);
    } else if (strcmp(c, "destroyctx") == 0) {
        printf("destroyctx rc=%d\n", cu.ctx_destroy(ctx));
    } else if (strcmp(c, "info") == 0) {
        size_t f = 0, t = 0;
        r = cu.mem_get_info(&f, &t);
        printf("info rc=%d free=%zu total=%zu\n", r, f, t);
    } else if (strcmp(c, "nvmem") == 0) {
        /* nvidia-smi's memory query: NVML device `a` as an application dlopens it (through libvcuda's dlsym
         * when preloaded, so the quota view) */
        const char *path = getenv("VCUDA_REAL_LIBNVML");
        void *nv = dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*nv_init)(void) = nv ? (int (*)(void))dlsym(nv, "nvmlInit_v2") : NULL;
        int (*nv_handle)(unsigned, void **) = nv ? (int (*)(unsigned, void **))dlsym(nv, "nvmlDeviceGetHandleByIndex_v2") : NULL;
        int (*nv_mem)(void *, unsigned long long *) = nv ? (int (*)(void *, unsigned long long *))dlsym(nv, "nvmlDeviceGetMemoryInfo") : NULL;
        unsigned long long m[3] = {0, 0, 0}; /* nvmlMemory_t: total, free, used */
        void *dev = NULL;
        int nr = !nv_init || !nv_handle || !nv_mem ? -1 : nv_init();
        if (nr == 0) nr = nv_handle((unsigned)a, &dev);
        if (nr == 0) nr = nv_mem(dev, m);
        printf("nvmem rc=%d total=%llu free=%llu used=%llu\n", nr, m[0], m[1], m[2]);
    } else if (strcmp(c, "devs") == 0) {
        /* the devices this process sees: "devs rc=0 count=N uuid0=GPU-... uuid1=..." */
        int n = 0;
        r = cu.device_count && cu.device_get && cu.device_uuid ? cu.device_count(&n) : CUDA_ERROR_NOT_FOUND;
        char line[4096];
        int used = 0;
        for (int i = 0; r == CUDA_SUCCESS && i < n && used < (int)sizeof line - 64; i++) {
            CUdevice dev = 0;
            CUuuid u;
            memset(&u, 0, sizeof u);
            r = cu.device_get(&dev, i);
            if (r == CUDA_SUCCESS) r = cu.device_uuid(&u, dev);
            if (r != CUDA_SUCCESS) break;
            const unsigned char *b = (const unsigned char *)u.bytes;
            used += snprintf(line + used, sizeof line - (size_t)used,
                             " uuid%d=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", i, b[0],
                             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        }
        line[used < (int)sizeof line ? used : (int)sizeof line - 1] = '\0';
        printf("devs rc=%d count=%d%s\n", r, n, line);
    } else if (strcmp(c, "total") == 0) {
        size_t t = 0;
        r = cu.total_mem(&t, (CUdevice)a);
        printf("total rc=%d total=%zu\n", r, t);
    } else if (strcmp(c, "freeall") == 0) {
        int bad = 0;
        while (nheld > 0) bad += release(&held[--nheld]) != CUDA_SUCCESS;
        printf("freeall rc=%d\n", bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
    } else if (strcmp(c, "free") == 0) {
        r = nheld ? release(&held[--nheld]) : CUDA_ERROR_INVALID_VALUE;
        printf("free rc=%d\n", r);
    } else if (strcmp(c, "freeunknown") == 0) {
        printf("freeunknown rc=%d\n", cu.mem_free((CUdeviceptr)0xdead0000ull));
    } else if (strcmp(c, "fill") == 0) {
        /* allocate chunks of `a` bytes until refused; report how many fit */
        long n = 0;
        struct held h;
        while ((r = allocate("alloc", a, 0, 0, 0, &h)) == CUDA_SUCCESS) { keep(h.kind, h.handle); n++; }
        printf("fill rc=%d count=%ld bytes=%llu\n", r, n, (unsigned long long)n * a);
    } else if (strcmp(c, "hold") == 0) {
        printf("holding\n");
        char line[16];
        if (fgets(line, sizeof line, stdin) == NULL) { /* parent closed: carry on */ }
    } else if (strcmp(c, "sleep") == 0) {
        usleep((useconds_t)(a * 1000));
    } else if (strcmp(c, "stress") == 0) {
        int threads = (int)a;
        pthread_t tid[64];
        struct stress_arg sa[64];
        for (int t = 0; t < threads && t < 64; t++) {
            sa[t] = (struct stress_arg){.seed = (unsigned)(getpid() * 131 + t), .seconds = (double)b,
                                        .max_bytes = cc, .ctx = ctx};
            pthread_create(&tid[t], NULL, stress_thread, &sa[t]);
        }
        long ops = 0, denied = 0;
        for (int t = 0; t < threads && t < 64; t++) {
            pthread_join(tid[t], NULL);
            ops += sa[t].ops;
            denied += sa[t].denied;
        }
        printf("stress rc=0 ops=%ld denied=%ld\n", ops, denied);
    } else if (strcmp(c, "spin") == 0) {
        /* kernels of `a` us for `b` ms of wall time, synchronising every `cc` launches */
        CUmodule mod;
        CUfunction fn;
        r = cu.module_load(&mod, "spin");
        if (r == CUDA_SUCCESS) r = cu.module_function(&fn, mod, "spin");
        uint64_t us = a;
        void *params[] = {&us};
        long kernels = 0;
        unsigned long long every = cc ? cc : 1;
        double start = now_s(), end = start + (double)b / 1000.0;
        while (r == CUDA_SUCCESS && now_s() < end) {
            r = cu.launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
            if (r == CUDA_SUCCESS && ++kernels % (long)every == 0) r = cu.ctx_sync();
        }
        if (r == CUDA_SUCCESS) r = cu.ctx_sync();
        printf("spin rc=%d kernels=%ld busy_us=%llu wall_us=%.0f\n", r, kernels,
               (unsigned long long)kernels * a, (now_s() - start) * 1e6);
    } else if (strcmp(c, "spindevs") == 0) {
        /* like spin, on devices 0..d-1 at once, one thread each */
        struct spin_arg sa[8] = {{0}};
        pthread_t tid[8];
        int n = d > 8 ? 8 : (int)d;
        double start = now_s();
        for (int t = 0; t < n; t++) {
            sa[t] = (struct spin_arg){.device = t, .us = a, .ms = b, .every = cc ? cc : 1};
            pthread_create(&tid[t], NULL, spin_device_thread, &sa[t]);
        }
        r = CUDA_SUCCESS;
        printf("spindevs");
        for (int t = 0; t < n; t++) {
            pthread_join(tid[t], NULL);
            if (sa[t].rc != CUDA_SUCCESS) r = sa[t].rc;
        }
        printf(" rc=%d wall_us=%.0f", r, (now_s() - start) * 1e6);
        for (int t = 0; t < n; t++) printf(" busy%d_us=%llu", t, (unsigned long long)sa[t].kernels * a);
        printf("\n");
    } else if (strcmp(c, "bursts") == 0) {
        /* one `a`-us kernel every `b` ms for `cc` ms: a latency-sensitive tenant */
        CUmodule mod;
        CUfunction fn;
        r = cu.module_load(&mod, "burst");
        if (r == CUDA_SUCCESS) r = cu.module_function(&fn, mod, "burst");
        uint64_t us = a;
        void *params[] = {&us};
        long bursts = 0;
        double start = now_s(), worst = 0, total = 0;
        while (r == CUDA_SUCCESS && now_s() - start < (double)cc / 1000.0) {
            double t0 = now_s();
            r = cu.launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
            if (r == CUDA_SUCCESS) r = cu.ctx_sync();
            double took = now_s() - t0;
            worst = took > worst ? took : worst;
            total += took;
            bursts++;
            double next = start + bursts * (double)b / 1000.0;
            if (next > now_s()) usleep((useconds_t)((next - now_s()) * 1e6));
        }
        printf("bursts rc=%d count=%ld worst_us=%.0f mean_us=%.0f\n", r, bursts, worst * 1e6,
               bursts ? total / bursts * 1e6 : 0.0);
    } else if (strcmp(c, "fork") == 0) {
        /* the child allocates `a` bytes in a context of its own */
        pid_t pid = fork();
        if (pid == 0) {
            CUcontext cctx = NULL;
            CUresult cr = cu.primary_retain(&cctx, 0);
            if (cr == CUDA_SUCCESS) cr = cu.ctx_set_current(cctx);
            CUdeviceptr p = 0;
            if (cr == CUDA_SUCCESS) cr = cu.mem_alloc(&p, a);
            printf("child rc=%d\n", cr);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("fork rc=0 status=%d\n", status);
    } else if (memory_command(c, args[1], a, b, cc)) {
        /* done */
    } else {
        struct held h;
        r = allocate(c, a, b, cc, d, &h);
        if (r == CUDA_SUCCESS) keep(h.kind, h.handle);
        printf("%s rc=%d\n", c, r);
    }
}

int main(int argc, char **argv) {
    const char *via = "dlsym";
    int i = 1, from_stdin = 0;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strncmp(argv[i], "--via=", 6) == 0) via = argv[i] + 6;
        else if (strncmp(argv[i], "--cuda-version=", 15) == 0) cuda_version = atoi(argv[i] + 15);
        else if (strcmp(argv[i], "--ptds") == 0) ptds = 1;
        else if (strcmp(argv[i], "--stdin") == 0) from_stdin = 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (resolve(via) != 0) return 2;
    for (; i < argc; i++) run_command(argv[i]);
    char line[4096];
    while (from_stdin && fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0]) run_command(line);
        printf("--\n");
    }
    return 0;
}
