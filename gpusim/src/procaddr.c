/* cuGetProcAddress / cuGetProcAddress_v2: the version-aware symbol table,
 * built from the one list in api.h.
 *
 * For (name, cudaVersion, flags) the driver returns, among the rows with that
 * base name, the one with the highest minimum version <= cudaVersion,
 * preferring the per-thread-default-stream rows when
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM is set and the name has them.
 * No row with that name: SYMBOL_NOT_FOUND; rows, but all too new:
 * VERSION_NOT_SUFFICIENT; both return CUDA_ERROR_NOT_FOUND and *pfn = NULL. */
#include <stdbool.h>
#include <string.h>

#include "api.h"

static const struct row {
    const char *base;
    int version;
    int ptds;
    void *fn;
} table[] = {
#define SIM_ROW(base, ver, ptds, sym, params) {#base, ver, ptds, (void *)sym},
    SIM_CUDA_API(SIM_ROW)
#undef SIM_ROW
};

static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    bool named = false;
    const struct row *best = NULL;
    int first_pass = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
    for (int pass = first_pass; pass >= 0 && !best; pass--) {
        for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
            const struct row *r = &table[i];
            if (r->ptds != pass || strcmp(r->base, symbol) != 0)
                continue;
            named = true;
            if (r->version <= cudaVersion && (!best || r->version > best->version))
                best = r;
        }
    }
    if (!best) {
        if (status)
            *status = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags)
{
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

SIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                        cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbolStatus)
{
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
