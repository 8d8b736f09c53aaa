/* Context limits (cuCtxSetLimit / cuCtxGetLimit) and the local memory they
 * and kernel launches reserve (vcudasim.h "Local memory and limits").
 *
 * A context reserves local memory for stack + frames of every thread the
 * device can hold: per-thread bytes x SMs x max threads per SM. The
 * per-thread figure is CU_LIMIT_STACK_SIZE (1024 at creation); a launch of a
 * kernel whose CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES is larger raises it to
 * that size and it never comes down by itself; cuCtxSetLimit sets it, down
 * too. What a fresh context holds (1024 bytes per thread, 8 MiB malloc heap,
 * 1 MiB printf FIFO, 2048 pending device launches) is part of
 * VCUDA_SIM_CONTEXT_OVERHEAD; only growth above it is charged here, as
 * SIM_MEM_LOCAL (stack) and SIM_MEM_LIMITS (the others). */
#define _GNU_SOURCE
#include <stdlib.h>

#include "api.h"
#include "sim.h"

#define DEFAULT_STACK 1024ull
#define DEFAULT_HEAP (8ull << 20)
#define DEFAULT_FIFO (1ull << 20)
#define DEFAULT_PENDING 2048ull
#define PENDING_LAUNCH_BYTES 2048ull /* device memory per pending device-side launch */

struct sim_ctx_mem {
    uint64_t stack, heap, fifo, pending, l2_fetch, l2_persist, cig_fallback;
    uint64_t local_key, limits_key; /* allocation-map entries of the growth */
};

/* Caller holds sim.mu. NULL only when out of host memory. */
static struct sim_ctx_mem *ctx_mem(struct sim_ctx *c)
{
    if (!c->mem) {
        struct sim_ctx_mem *m = calloc(1, sizeof *m);
        if (!m)
            return NULL;
        *m = (struct sim_ctx_mem){.stack = DEFAULT_STACK, .heap = DEFAULT_HEAP,
                                  .fifo = DEFAULT_FIFO, .pending = DEFAULT_PENDING,
                                  .l2_fetch = 32};
        __atomic_store_n(&c->mem, m, __ATOMIC_RELEASE);
    }
    return c->mem;
}

static uint64_t above(uint64_t v, uint64_t base)
{
    return v > base ? v - base : 0;
}

static uint64_t local_bytes(unsigned phys, uint64_t stack)
{
    return above(stack, DEFAULT_STACK) * sim.sh->dev[phys].sms * sim.sh->threads_per_sm;
}

static uint64_t limits_bytes(const struct sim_ctx_mem *m)
{
    return above(m->heap, DEFAULT_HEAP) + above(m->fifo, DEFAULT_FIFO) +
           above(m->pending, DEFAULT_PENDING) * PENDING_LAUNCH_BYTES;
}

/* Caller holds sim.mu. */
static CUresult set_stack(struct sim_ctx *c, struct sim_ctx_mem *m, uint64_t stack)
{
    CUresult rc =
        sim_alloc_resize(&m->local_key, local_bytes(c->phys, stack), c, SIM_ALLOC_LOCAL);
    if (rc == CUDA_SUCCESS)
        __atomic_store_n(&m->stack, stack, __ATOMIC_RELEASE);
    return rc;
}

uint64_t sim_ctx_stack(const struct sim_ctx *c)
{
    const struct sim_ctx_mem *m = __atomic_load_n(&c->mem, __ATOMIC_ACQUIRE);
    return m ? __atomic_load_n(&m->stack, __ATOMIC_ACQUIRE) : DEFAULT_STACK;
}

CUresult sim_local_reserve(struct sim_ctx *c, uint64_t per_thread)
{
    if (per_thread <= sim_ctx_stack(c))
        return CUDA_SUCCESS;
    struct sim_ctx_mem *m = ctx_mem(c);
    return m ? set_stack(c, m, per_thread) : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Caller holds sim.mu. Sets one of the limits that take device memory. */
static CUresult set_limits(struct sim_ctx *c, struct sim_ctx_mem *m, uint64_t *field, uint64_t v)
{
    uint64_t old = *field;
    *field = v;
    CUresult rc = sim_alloc_resize(&m->limits_key, limits_bytes(m), c, SIM_ALLOC_LIMITS);
    if (rc != CUDA_SUCCESS)
        *field = old;
    return rc;
}

SIM_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    struct sim_ctx *c;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    struct sim_ctx_mem *m = ctx_mem(c);
    if (!m) {
        pthread_mutex_unlock(&sim.mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    switch ((int)limit) {
    case CU_LIMIT_STACK_SIZE: rc = set_stack(c, m, value); break;
    case CU_LIMIT_PRINTF_FIFO_SIZE: rc = set_limits(c, m, &m->fifo, value); break;
    case CU_LIMIT_MALLOC_HEAP_SIZE: rc = set_limits(c, m, &m->heap, value); break;
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: rc = set_limits(c, m, &m->pending, value); break;
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
        if (value > 128)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            m->l2_fetch = value;
        break;
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE: m->l2_persist = value; break; /* L2, not DRAM */
    case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED: m->cig_fallback = value != 0; break;
    case CU_LIMIT_SHMEM_SIZE:
    case CU_LIMIT_CIG_ENABLED: rc = CUDA_ERROR_INVALID_VALUE; break; /* query only */
    default: rc = CUDA_ERROR_UNSUPPORTED_LIMIT; break; /* SYNC_DEPTH: compute capability < 9.0 */
    }
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

SIM_EXPORT CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    struct sim_ctx *c;
    if (!pvalue)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    const struct sim_ctx_mem *m = ctx_mem(c);
    if (!m) {
        pthread_mutex_unlock(&sim.mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    switch ((int)limit) {
    case CU_LIMIT_STACK_SIZE: *pvalue = m->stack; break;
    case CU_LIMIT_PRINTF_FIFO_SIZE: *pvalue = m->fifo; break;
    case CU_LIMIT_MALLOC_HEAP_SIZE: *pvalue = m->heap; break;
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: *pvalue = m->pending; break;
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY: *pvalue = m->l2_fetch; break;
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE: *pvalue = m->l2_persist; break;
    case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED: *pvalue = m->cig_fallback; break;
    case CU_LIMIT_SHMEM_SIZE: *pvalue = 49152; break;
    case CU_LIMIT_CIG_ENABLED: *pvalue = 0; break;
    default: rc = CUDA_ERROR_UNSUPPORTED_LIMIT; break;
    }
    pthread_mutex_unlock(&sim.mu);
    return rc;
}
