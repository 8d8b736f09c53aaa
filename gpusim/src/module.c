/* Modules, libraries and function handles. Any image loads and any name
 * resolves: the simulator never runs code, only timelines. An image that is
 * a module descriptor (vcudasim.h "Module descriptors") also says what its
 * kernels need: local memory per thread and code bytes. Code is loaded as
 * CUDA_MODULE_LOADING says: LAZY (the default) at a kernel's first launch in
 * each context, EAGER at load for every kernel the descriptor lists. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "sim.h"

#define DESC_MAGIC "vcudasim-module"
#define DESC_MAX (1u << 20) /* longest descriptor file read by cuModuleLoad */

bool sim_func_valid(const struct sim_func *f)
{
    return f && f->magic == SIM_FUNC_MAGIC && f->mod && f->mod->alive;
}

/* ---- descriptors ---- */

struct kernel_desc {
    uint64_t local, code;
};

/* Reads "local=<q> code=<q>" fields after a kernel or default line. */
static int parse_fields(char *p, struct kernel_desc *k)
{
    char *save = NULL;
    for (char *tok = strtok_r(p, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return -1;
        *eq = '\0';
        uint64_t *dst = !strcmp(tok, "local") ? &k->local : !strcmp(tok, "code") ? &k->code : NULL;
        if (!dst || sim_parse_quantity(eq + 1, dst) != 0)
            return -1;
    }
    return 0;
}

/* Walks a descriptor. With name == NULL checks it and returns its data bytes
 * in *data; else fills *k for that kernel (the default line if not listed)
 * and, with each != NULL, calls it for every listed kernel. -1: malformed. */
static int desc_walk(const char *text, const char *name, struct kernel_desc *k, uint64_t *data,
                     void (*each)(const char *kernel, void *arg), void *arg)
{
    char *copy = strdup(text + strlen(DESC_MAGIC));
    if (!copy)
        return -1;
    struct kernel_desc dflt = {0, sim.sh ? sim.sh->kernel_code : 0}, found = {0, 0};
    bool listed = false;
    int rc = 0;
    char *save = NULL;
    if (data)
        *data = 0;
    for (char *line = strtok_r(copy, "\n;", &save); line && rc == 0;
         line = strtok_r(NULL, "\n;", &save)) {
        line += strspn(line, " \t");
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        if (!*line)
            continue;
        char *rest = line + strcspn(line, " \t");
        if (*rest)
            *rest++ = '\0';
        if (!strcmp(line, "data")) {
            uint64_t v;
            rest += strspn(rest, " \t");
            rest[strcspn(rest, " \t")] = '\0';
            if (sim_parse_quantity(rest, &v) != 0)
                rc = -1;
            else if (data)
                *data += v;
        } else if (!strcmp(line, "default")) {
            rc = parse_fields(rest, &dflt);
        } else if (!strcmp(line, "kernel")) {
            rest += strspn(rest, " \t");
            char *fields = rest + strcspn(rest, " \t");
            if (*fields)
                *fields++ = '\0';
            struct kernel_desc kd = {0, dflt.code};
            if (!*rest || parse_fields(fields, &kd) != 0)
                rc = -1;
            else if (name && !strcmp(rest, name)) {
                found = kd;
                listed = true;
            } else if (each) {
                each(rest, arg);
            }
        } else {
            rc = -1;
        }
    }
    free(copy);
    if (k)
        *k = listed ? found : dflt;
    return rc;
}

/* ---- modules ---- */

static struct sim_module *module_of(void *h)
{
    struct sim_module *m = h;
    return m && m->magic == SIM_MODULE_MAGIC && m->alive ? m : NULL;
}

static void free_code(uint64_t key)
{
    struct sim_alloc_entry e;
    if (key && sim_alloc_take(key, SIM_ALLOC_BIT(SIM_ALLOC_MODULE), &e) == CUDA_SUCCESS)
        sim_uncharge_as(e.phys, SIM_MEM_MODULE, e.bytes);
}

/* Caller holds sim.mu. Loads f's code into ctx unless it is there. */
static CUresult load_code(struct sim_func *f, struct sim_ctx *ctx)
{
    for (struct sim_code_load *l = f->loads; l; l = l->next)
        if (l->ctx == ctx)
            return CUDA_SUCCESS;
    struct sim_code_load *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->ctx = ctx;
    CUresult rc = f->code_bytes ? sim_alloc_resize(&l->key, f->code_bytes, ctx, SIM_ALLOC_MODULE)
                                : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) {
        free(l);
        return rc;
    }
    l->next = f->loads;
    f->loads = l;
    return CUDA_SUCCESS;
}

/* One handle per (module, name), so repeated lookups do not leak. Caller
 * holds sim.mu. */
static CUresult get_function_locked(struct sim_module *m, const char *name, struct sim_func **out)
{
    struct sim_func *f = m->funcs;
    while (f && strcmp(f->name, name) != 0)
        f = f->next;
    if (!f) {
        struct kernel_desc k = {0, sim.sh->kernel_code};
        if (m->desc)
            desc_walk(m->desc, name, &k, NULL, NULL, NULL); /* checked at load */
        f = calloc(1, sizeof *f);
        char *copy = f ? strdup(name) : NULL;
        if (!copy) {
            free(f);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *f = (struct sim_func){.magic = SIM_FUNC_MAGIC, .mod = m, .name = copy,
                               .next = m->funcs, .local_bytes = k.local, .code_bytes = k.code};
        m->funcs = f;
    }
    *out = f;
    return CUDA_SUCCESS;
}

static CUresult get_function(struct sim_module *m, const char *name, struct sim_func **out)
{
    pthread_mutex_lock(&sim.mu);
    CUresult rc = get_function_locked(m, name, out);
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

struct eager_arg {
    struct sim_module *m;
    struct sim_ctx *ctx;
    CUresult rc;
};

static void eager_load(const char *kernel, void *arg)
{
    struct eager_arg *a = arg;
    struct sim_func *f;
    if (a->rc == CUDA_SUCCESS && (a->rc = get_function_locked(a->m, kernel, &f)) == CUDA_SUCCESS)
        a->rc = load_code(f, a->ctx);
}

static void module_free_memory(struct sim_module *m)
{
    for (struct sim_func *f = m->funcs; f; f = f->next) {
        for (struct sim_code_load *l = f->loads, *n; l; l = n) {
            n = l->next;
            free_code(l->key);
            free(l);
        }
        f->loads = NULL;
        f->ready_ctx = NULL;
    }
    free_code(m->data_key);
    m->data_key = 0;
}

/* text: the image when it is a descriptor, else NULL. Modules need a current
 * context and charge their data and (EAGER) code to it; libraries do so only
 * when there is one. */
static CUresult module_new(struct sim_module **out, bool library, const char *text)
{
    struct sim_ctx *c = NULL;
    CUresult rc = library ? sim_check_init() : sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (library)
        c = sim_current_ctx();
    uint64_t data = 0;
    if (text && desc_walk(text, NULL, NULL, &data, NULL, NULL) != 0)
        return CUDA_ERROR_INVALID_IMAGE;
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m || (text && !(m->desc = strdup(text)))) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->magic = SIM_MODULE_MAGIC;
    m->alive = true;
    m->library = library;
    pthread_mutex_lock(&sim.mu);
    if (c && data)
        rc = sim_alloc_resize(&m->data_key, data, c, SIM_ALLOC_MODULE);
    if (rc == CUDA_SUCCESS && c && text && sim.eager_modules) {
        struct eager_arg a = {m, c, CUDA_SUCCESS};
        desc_walk(text, "", NULL, NULL, eager_load, &a);
        rc = a.rc;
    }
    if (rc != CUDA_SUCCESS)
        module_free_memory(m);
    pthread_mutex_unlock(&sim.mu);
    if (rc != CUDA_SUCCESS) {
        m->alive = false; /* its struct stays allocated, as every handle's */
        return rc;
    }
    *out = m;
    return CUDA_SUCCESS;
}

static const char *descriptor(const void *image)
{
    return strncmp(image, DESC_MAGIC, strlen(DESC_MAGIC)) == 0 ? image : NULL;
}

SIM_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    char *buf = malloc(DESC_MAX + 1);
    ssize_t n = buf ? read(fd, buf, DESC_MAX) : -1;
    close(fd);
    if (n < 0) {
        free(buf);
        return buf ? CUDA_ERROR_FILE_NOT_FOUND : CUDA_ERROR_OUT_OF_MEMORY;
    }
    buf[n] = '\0';
    CUresult rc = module_new((struct sim_module **)module, false, descriptor(buf));
    free(buf);
    return rc;
}

SIM_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    return module_new((struct sim_module **)module, false, descriptor(image));
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
    pthread_mutex_lock(&sim.mu);
    struct sim_module *m = module_of(hmod);
    if (m) {
        m->alive = false; /* its functions become invalid; all stay allocated */
        module_free_memory(m);
    }
    pthread_mutex_unlock(&sim.mu);
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
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
    return module_new((struct sim_module **)library, true, descriptor(code));
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

/* ---- what a function needs to run ---- */

CUresult sim_func_ready(struct sim_func *f, struct sim_ctx *ctx)
{
    if (__atomic_load_n(&f->ready_ctx, __ATOMIC_ACQUIRE) == ctx &&
        f->local_bytes <= sim_ctx_stack(ctx))
        return CUDA_SUCCESS; /* code loaded here, local memory big enough */
    pthread_mutex_lock(&sim.mu);
    CUresult rc = load_code(f, ctx);
    if (rc == CUDA_SUCCESS)
        rc = sim_local_reserve(ctx, f->local_bytes);
    if (rc == CUDA_SUCCESS)
        __atomic_store_n(&f->ready_ctx, ctx, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

static CUresult func_attribute(int *pi, CUfunction_attribute attrib, const struct sim_func *f)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_func_valid(f))
        return CUDA_ERROR_INVALID_HANDLE;
    switch ((int)attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
        *pi = f->local_bytes > 0x7fffffff ? 0x7fffffff : (int)f->local_bytes;
        break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 90; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = 49152; break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = -1; break;
    default:
        if (attrib < 0 || attrib > 20) /* past the attributes cuda.h 13.0 defines */
            return CUDA_ERROR_INVALID_VALUE;
        *pi = 0;
        break;
    }
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    return func_attribute(pi, attrib, (const struct sim_func *)hfunc);
}

SIM_EXPORT CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel,
                                         CUdevice dev)
{
    unsigned phys;
    CUresult rc = sim_ordinal(dev, &phys);
    return rc == CUDA_SUCCESS ? func_attribute(pi, attrib, (const struct sim_func *)kernel) : rc;
}
