/* The override layer: exported driver names (one-line forwards to vc_*), the
 * dlsym override, and version-aware cuGetProcAddress / cuGetProcAddress_v2.
 *
 * ABI selection. The CUDA 12/13 runtime resolves every driver entry point
 * through cuGetProcAddress_v2(symbol, cudaVersion, flags), and one base name
 * maps to different ABIs by version and per-thread-stream flag (cuMemAlloc ->
 * cuMemAlloc_v2, cuMemAllocAsync -> _ptsz with the PTDS flag, cuCtxCreate ->
 * _v4 on 13.x). The driver is the authority on that mapping, so we ask it: the
 * real cuGetProcAddress returns the address of one exported variant, and we
 * hand out the wrapper of exactly the variant whose real address that is.
 * Below the version a _v2 appeared in, that is the legacy unsuffixed ABI
 * (cuStreamBeginCapture without a mode below 10010, cuDevicePrimaryCtxRelease
 * and cuGraphInstantiate below 11000), hooked like any other variant.
 * Names we do not hook, and variants we do not know, pass through untouched
 * (the latter with a warning that says which entry point it was).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "hooks.h"
#include "log.h"
#include "process.h"
#include "real_driver.h"

#define VCUDA_EXPORT __attribute__((visibility("default")))

/* ---- exported names ----------------------------------------------------- */

#define VCUDA_EXPORT_CUDA(name, params, args) \
    VCUDA_EXPORT CUresult name params { return vc_##name args; }
VCUDA_CUDA_HOOKS(VCUDA_EXPORT_CUDA)
#undef VCUDA_EXPORT_CUDA

#define VCUDA_EXPORT_NVML(name, params, args) \
    VCUDA_EXPORT nvmlReturn_t name params { return vc_##name args; }
VCUDA_NVML_HOOKS(VCUDA_EXPORT_NVML)
#undef VCUDA_EXPORT_NVML

/* ---- the hook table ----------------------------------------------------- */

#define VCUDA_ENTRY_CUDA(name, params, args) {#name, (void *)vc_##name, (void **)&vcuda_real.name, 0, false},
#define VCUDA_ENTRY_NVML(name, params, args) {#name, (void *)vc_##name, (void **)&vcuda_real_nvml.name, 0, false},
static struct vcuda_hook hooks[] = {
    VCUDA_CUDA_HOOKS(VCUDA_ENTRY_CUDA) VCUDA_NVML_HOOKS(VCUDA_ENTRY_NVML)
};
#undef VCUDA_ENTRY_CUDA
#undef VCUDA_ENTRY_NVML
#define HOOK_COUNT (sizeof hooks / sizeof hooks[0])

/* Our own exported definitions, so dlsym(RTLD_DEFAULT, name), which finds
 * them first, maps to the wrapper too. */
#define VCUDA_SELF(name, params, args) (void *)name,
static void *const self_exports[] = {VCUDA_CUDA_HOOKS(VCUDA_SELF) VCUDA_NVML_HOOKS(VCUDA_SELF)};
#undef VCUDA_SELF

/* Length of `name` without ABI suffixes: _v2, _v3, ..., _ptsz, _ptds. */
static unsigned base_length(const char *name) {
    size_t len = strlen(name);
    for (;;) {
        if (len > 5 && (memcmp(name + len - 5, "_ptsz", 5) == 0 || memcmp(name + len - 5, "_ptds", 5) == 0)) {
            len -= 5;
            continue;
        }
        if (len > 3 && name[len - 3] == '_' && name[len - 2] == 'v' && name[len - 1] >= '2' && name[len - 1] <= '9') {
            len -= 3;
            continue;
        }
        return (unsigned)len;
    }
}

/* Whether hook `h`'s name carries a _vN suffix after its base name. */
static bool versioned(const struct vcuda_hook *h) { return strstr(h->name + h->base_len, "_v") != NULL; }

/* Whether hook `h` is a variant of base name `base` (`len` characters). */
static bool of_base(const struct vcuda_hook *h, const char *base, size_t len) {
    return h->base_len == len && strncmp(h->name, base, len) == 0;
}

void vcuda_hooks_init(void) {
    for (size_t i = 0; i < HOOK_COUNT; i++) hooks[i].base_len = base_length(hooks[i].name);
    for (size_t i = 0; i < HOOK_COUNT; i++) {
        hooks[i].legacy = false;
        for (size_t j = 0; j < HOOK_COUNT && !versioned(&hooks[i]); j++)
            if (of_base(&hooks[j], hooks[i].name, hooks[i].base_len) && versioned(&hooks[j])) hooks[i].legacy = true;
    }
}

/* Real libraries must be loaded before real addresses can be compared. */
static void load_for(const char *name) {
    if (name[0] == 'n') vcuda_nvml_load();
    else vcuda_driver_load();
}

void *vcuda_hook_for_symbol(const char *name, void *real_fn) {
    if (real_fn == NULL) return NULL;
    for (size_t i = 0; i < HOOK_COUNT; i++) {
        if (strcmp(hooks[i].name, name) != 0) continue;
        if (real_fn == self_exports[i]) return hooks[i].wrapper;
        load_for(name);
        /* Another library's function of the same name is none of our business. */
        return real_fn == *hooks[i].real ? hooks[i].wrapper : real_fn;
    }
    return real_fn;
}

/* The warning for an entry point of a hooked base name that matches no hook,
 * with what tells why: which of the driver's exports it is (the bare name is
 * the legacy ABI), the symbol dladdr puts it in, and the real addresses of
 * the variants vcuda hooks. Rare: only on this path. */
static void warn_unknown(const char *symbol, void *real_fn, int cudaVersion, cuuint64_t flags) {
    static const char *const versions[] = {"", "_v2", "_v3", "_v4"};
    static const char *const streams[] = {"", "_ptsz", "_ptds"};
    char is[200] = "";
    for (size_t v = 0; v < sizeof versions / sizeof versions[0] && !is[0] && vcuda_libcuda_handle; v++) {
        for (size_t t = 0; t < sizeof streams / sizeof streams[0] && !is[0]; t++) {
            char name[120];
            int n = snprintf(name, sizeof name, "%s%s%s", symbol, versions[v], streams[t]);
            if (n < 0 || (size_t)n >= sizeof name || vcuda_real_dlsym(vcuda_libcuda_handle, name) != real_fn) continue;
            snprintf(is, sizeof is, "the driver's export %s%s", name, v == 0 && t == 0 ? " (the legacy ABI)" : "");
        }
    }
    if (!is[0]) snprintf(is, sizeof is, "none of the driver's exports %s[_v2|_v3|_v4][_ptsz|_ptds]", symbol);
    Dl_info info;
    char near[200] = "";
    if (dladdr(real_fn, &info) && info.dli_fname) {
        const char *lib = strrchr(info.dli_fname, '/');
        snprintf(near, sizeof near, " (dladdr: %s+%#lx in %s)", info.dli_sname ? info.dli_sname : "?",
                 info.dli_saddr ? (unsigned long)((char *)real_fn - (char *)info.dli_saddr) : 0ul,
                 lib ? lib + 1 : info.dli_fname);
    }
    char hooked[320] = "";
    size_t used = 0, len = strlen(symbol);
    for (size_t i = 0; i < HOOK_COUNT && used < sizeof hooked; i++) {
        if (!of_base(&hooks[i], symbol, len)) continue;
        int n = *hooks[i].real ? snprintf(hooked + used, sizeof hooked - used, " %s=%p", hooks[i].name, *hooks[i].real)
                               : snprintf(hooked + used, sizeof hooked - used, " %s=absent", hooks[i].name);
        if (n > 0) used += (size_t)n;
    }
    vcuda_warn("cuGetProcAddress(\"%s\", cudaVersion %d, flags %#llx) returned an entry point vcuda does not know; "
               "passing it through (%p: %s%s; vcuda hooks%s)",
               symbol, cudaVersion, (unsigned long long)flags, real_fn, is, near, hooked);
}

void *vcuda_hook_for_proc(const char *symbol, void *real_fn, int cudaVersion, cuuint64_t flags) {
    if (real_fn == NULL || symbol == NULL) return real_fn;
    size_t len = strlen(symbol);
    bool known_base = false;
    for (size_t i = 0; i < HOOK_COUNT; i++) {
        if (!of_base(&hooks[i], symbol, len)) continue;
        known_base = true;
        if (*hooks[i].real != real_fn) continue;
        if (hooks[i].legacy)
            vcuda_info("cuGetProcAddress(\"%s\", cudaVersion %d, flags %#llx) returned the legacy ABI %s; wrapped",
                       symbol, cudaVersion, (unsigned long long)flags, hooks[i].name);
        return hooks[i].wrapper;
    }
    /* A base name may map to an entry point of another name (cuGraphInstantiate
     * -> cuGraphInstantiateWithFlags from 12000): its address says which. */
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (*hooks[i].real == real_fn) return hooks[i].wrapper;
    if (known_base) warn_unknown(symbol, real_fn, cudaVersion, flags);
    return real_fn;
}

/* ---- cuGetProcAddress ---------------------------------------------------- */

CUresult vc_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGetProcAddress, "cuGetProcAddress");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn && !vcuda_config.disabled)
        *pfn = vcuda_hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return rc;
}

CUresult vc_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                CUdriverProcAddressQueryResult *symbolStatus) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGetProcAddress_v2, "cuGetProcAddress_v2");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn && !vcuda_config.disabled)
        *pfn = vcuda_hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return rc;
}

/* ---- cuInit ---------------------------------------------------------------- */

CUresult vc_cuInit(unsigned int flags) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuInit, "cuInit");
    if (rc != CUDA_SUCCESS) return rc;
    if (!vcuda_config.disabled) {
        /* Configuration errors surface here, at the first CUDA call. */
        rc = vcuda_process_ready();
        if (rc != CUDA_SUCCESS) return rc;
    }
    return vcuda_real.cuInit(flags);
}

/* ---- dlsym ------------------------------------------------------------------ */

/* Called by the dlsym trampoline (dlsym_trampoline.c) for every handle but
 * RTLD_NEXT, which the trampoline sends straight to glibc so the caller's
 * return address, which RTLD_NEXT depends on, is the application's. */
__attribute__((used)) VCUDA_NO_SANITIZE void *vcuda_dlsym_impl(void *handle, const char *name) {
    if (vcuda_real_dlsym == NULL) vcuda_real_dlsym_init();
    void *fn = vcuda_real_dlsym(handle, name);
    if (fn == NULL || name == NULL || vcuda_config.disabled) return fn;
    if ((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0)
        return vcuda_hook_for_symbol(name, fn);
    return fn;
}
