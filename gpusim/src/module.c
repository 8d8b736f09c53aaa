/* Modules, libraries and function handles. Any image loads and any name
 * resolves: the simulator never runs code, only timelines. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "sim.h"

bool sim_func_valid(const struct sim_func *f)
{
    return f && f->magic == SIM_FUNC_MAGIC && f->mod && f->mod->alive;
}

static CUresult module_new(struct sim_module **out, bool need_ctx)
{
    struct sim_ctx *c;
    CUresult rc = need_ctx ? sim_require_ctx(&c) : sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = SIM_MODULE_MAGIC;
    m->alive = true;
    *out = m;
    return CUDA_SUCCESS;
}

static struct sim_module *module_of(void *h)
{
    struct sim_module *m = h;
    return m && m->magic == SIM_MODULE_MAGIC && m->alive ? m : NULL;
}

/* One handle per (module, name), so repeated lookups do not leak. */
static CUresult get_function(struct sim_module *m, const char *name, struct sim_func **out)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&sim.mu);
    struct sim_func *f = m->funcs;
    while (f && strcmp(f->name, name) != 0)
        f = f->next;
    if (!f) {
        f = calloc(1, sizeof *f);
        char *copy = f ? strdup(name) : NULL;
        if (!copy) {
            free(f);
            f = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *f = (struct sim_func){.magic = SIM_FUNC_MAGIC, .mod = m, .name = copy,
                                   .next = m->funcs};
            m->funcs = f;
        }
    }
    pthread_mutex_unlock(&sim.mu);
    *out = f;
    return rc;
}

SIM_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    if (access(fname, R_OK) != 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    return module_new((struct sim_module **)module, true);
}

SIM_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    return module_new((struct sim_module **)module, true);
}

SIM_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image,
                                       unsigned int numOptions, CUjit_option *options,
                                       void **optionValues)
{
    (void)numOptions;
    (void)options;
    (void)optionValues;
    return cuModuleLoadData(module, image);
}

SIM_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_module *m = module_of(hmod);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    m->alive = false; /* its functions become invalid; all stay allocated */
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_module *m = module_of(hmod);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    return get_function(m, name, (struct sim_func **)hfunc);
}

/* Libraries are context-independent in CUDA 12: no current context needed. */
SIM_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code,
                                      CUjit_option *jitOptions, void **jitOptionsValues,
                                      unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                      void **libraryOptionValues, unsigned int numLibraryOptions)
{
    (void)jitOptions;
    (void)jitOptionsValues;
    (void)numJitOptions;
    (void)libraryOptions;
    (void)libraryOptionValues;
    (void)numLibraryOptions;
    if (!library || !code)
        return CUDA_ERROR_INVALID_VALUE;
    return module_new((struct sim_module **)library, false);
}

SIM_EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    return cuModuleGetFunction((CUfunction *)pKernel, (CUmodule)library, name);
}

SIM_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    return cuModuleUnload((CUmodule)library);
}

SIM_EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_func_valid((const struct sim_func *)kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    *pFunc = (CUfunction)kernel;
    return CUDA_SUCCESS;
}
