/* Graph memory nodes (vcudasim.h "Graph memory"): allocations made while a
 * stream is captured (cuMemAllocAsync / cuMemFreeAsync) or added with
 * cuGraphAddMemAllocNode / cuGraphAddMemFreeNode.
 *
 * An executable graph's footprint is the peak of its live allocations in
 * node order, each rounded up to 2 MiB; a captured free lets later captured
 * allocations reuse the memory, explicitly added nodes never share (their
 * order is a DAG the simulator does not follow: the upper bound). The
 * footprint is mapped when the graph is uploaded or first launched, from a
 * per-device graph reserve of this process that grows as needed (charged as
 * SIM_MEM_GRAPH) and never shrinks by itself: not when the graph is
 * destroyed, not at synchronize. cuDeviceGraphMemTrim returns what no graph
 * executing or scheduled (its last launch not finished) holds; a trimmed
 * graph maps its footprint again at its next launch.
 * Lock order: sim.mu, then gmu, then the shared lock. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "sim.h"

struct gm_node {
    bool is_free;
    bool live; /* an allocation not freed in the graph, after a launch, until cuMemFree */
    uint64_t bytes; /* rounded up to 2 MiB */
    CUdeviceptr addr;
};

struct sim_graph_mem {
    struct gm_node *nodes;
    size_t n, cap;
    bool explicit_nodes; /* some node came from cuGraphAdd*: no reuse */
    CUdevice ordinal;
    unsigned phys;
    /* executable graphs only */
    bool exec, mapped, destroyed;
    uint64_t footprint;
    struct sim_stream *last_stream; /* busy while its last launch is queued there */
    struct sim_mark last_end; /* its last launch's last kernel */
    struct sim_graph_mem *next_exec;
};

struct graph_reserve {
    uint64_t reserved, used, reserved_high, used_high;
};

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_graph_mem *execs; /* executable graphs with memory nodes */
static struct graph_reserve reserve[SIM_MAX_PHYS]; /* by physical device */
static uint32_t reserve_gen; /* sim.gen the reserve belongs to: a fork child starts empty */

static struct graph_reserve *reserve_of(unsigned phys)
{
    if (reserve_gen != sim.gen) {
        memset(reserve, 0, sizeof reserve);
        execs = NULL;
        reserve_gen = sim.gen;
    }
    return &reserve[phys];
}

static uint64_t round_2m(uint64_t v)
{
    return (v + SIM_VMM_GRANULARITY - 1) & ~(SIM_VMM_GRANULARITY - 1);
}

/* Caller holds sim.mu. */
static CUresult add_node(struct sim_graph *g, struct gm_node node, CUdevice ordinal,
                         unsigned phys, bool explicit_node)
{
    struct sim_graph_mem *m = g->mem;
    if (!m) {
        if (!(m = calloc(1, sizeof *m)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        m->ordinal = ordinal;
        m->phys = phys;
        g->mem = m;
    }
    if (!node.is_free && m->n && m->phys != phys)
        return CUDA_ERROR_NOT_SUPPORTED; /* one device per graph in the simulator */
    if (m->n == m->cap) {
        size_t ncap = m->cap ? 2 * m->cap : 8;
        struct gm_node *n = realloc(m->nodes, ncap * sizeof *n);
        if (!n)
            return CUDA_ERROR_OUT_OF_MEMORY;
        m->nodes = n;
        m->cap = ncap;
    }
    m->nodes[m->n++] = node;
    m->explicit_nodes |= explicit_node;
    return CUDA_SUCCESS;
}

/* Caller holds sim.mu. The allocation node of g at addr, not freed in g yet. */
static struct gm_node *find_alloc(struct sim_graph *g, CUdeviceptr addr)
{
    struct sim_graph_mem *m = g->mem;
    struct gm_node *found = NULL;
    for (size_t i = 0; m && i < m->n; i++) {
        if (m->nodes[i].addr != addr)
            continue;
        found = m->nodes[i].is_free ? NULL : &m->nodes[i];
    }
    return found;
}

static CUresult alloc_node(struct sim_graph *g, CUdevice ordinal, unsigned phys, uint64_t bytes,
                           CUdeviceptr *dptr, bool explicit_node)
{
    struct gm_node node = {.bytes = round_2m(bytes), .addr = sim_new_address(bytes, 0)};
    CUresult rc = add_node(g, node, ordinal, phys, explicit_node);
    if (rc == CUDA_SUCCESS)
        *dptr = node.addr;
    return rc;
}

static CUresult free_node(struct sim_graph *g, CUdeviceptr dptr, bool explicit_node)
{
    const struct gm_node *a = find_alloc(g, dptr);
    if (!a) /* only this graph's own allocations */
        return CUDA_ERROR_INVALID_VALUE;
    struct gm_node node = {.is_free = true, .bytes = a->bytes, .addr = dptr};
    return add_node(g, node, g->mem->ordinal, g->mem->phys, explicit_node);
}

CUresult sim_graph_mem_capture_alloc(struct sim_graph *g, struct sim_ctx *ctx, uint64_t bytes,
                                     CUdeviceptr *dptr)
{
    return alloc_node(g, ctx->ordinal, ctx->phys, bytes, dptr, false);
}

CUresult sim_graph_mem_capture_free(struct sim_graph *g, CUdeviceptr dptr)
{
    return free_node(g, dptr, false);
}

CUresult sim_graph_mem_instantiate(struct sim_graph *g, struct sim_graph *exec)
{
    const struct sim_graph_mem *m = g->mem;
    if (!m || !m->n)
        return CUDA_SUCCESS;
    struct sim_graph_mem *x = calloc(1, sizeof *x);
    struct gm_node *nodes = calloc(m->n, sizeof *nodes);
    if (!x || !nodes) {
        free(x);
        free(nodes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(nodes, m->nodes, m->n * sizeof *nodes);
    *x = (struct sim_graph_mem){.nodes = nodes, .n = m->n, .cap = m->n,
                                .explicit_nodes = m->explicit_nodes, .ordinal = m->ordinal,
                                .phys = m->phys, .exec = true};
    uint64_t live = 0;
    for (size_t i = 0; i < x->n; i++) {
        if (!nodes[i].is_free)
            live += nodes[i].bytes;
        else if (!x->explicit_nodes)
            live -= nodes[i].bytes;
        if (live > x->footprint)
            x->footprint = live;
    }
    exec->mem = x;
    pthread_mutex_lock(&gmu);
    reserve_of(x->phys);
    x->next_exec = execs;
    execs = x;
    pthread_mutex_unlock(&gmu);
    return CUDA_SUCCESS;
}

/* Whether allocation node i is freed by a later node of the same graph. */
static bool freed_in_graph(const struct sim_graph_mem *x, size_t i)
{
    for (size_t j = i + 1; j < x->n; j++)
        if (x->nodes[j].is_free && x->nodes[j].addr == x->nodes[i].addr)
            return true;
    return false;
}

static bool has_live(const struct sim_graph_mem *x)
{
    for (size_t i = 0; i < x->n; i++)
        if (x->nodes[i].live)
            return true;
    return false;
}

/* Caller holds gmu. Gives x's footprint back to the reserve (which keeps it). */
static void unmap(struct sim_graph_mem *x)
{
    if (x->mapped)
        reserve_of(x->phys)->used -= x->footprint;
    x->mapped = false;
}

/* Caller holds gmu. */
static CUresult map(struct sim_graph_mem *x)
{
    struct graph_reserve *r = reserve_of(x->phys);
    if (x->mapped)
        return CUDA_SUCCESS;
    uint64_t need = r->used + x->footprint;
    if (need > r->reserved) {
        CUresult rc = sim_charge_as(x->phys, SIM_MEM_GRAPH, need - r->reserved);
        if (rc != CUDA_SUCCESS)
            return rc;
        r->reserved = need;
        if (need > r->reserved_high)
            r->reserved_high = need;
    }
    r->used += x->footprint;
    if (r->used > r->used_high)
        r->used_high = r->used;
    x->mapped = true;
    return CUDA_SUCCESS;
}

CUresult sim_graph_mem_map(struct sim_graph *exec, struct sim_stream *s)
{
    struct sim_graph_mem *x = exec->mem;
    if (!x)
        return CUDA_SUCCESS;
    struct sim_ctx *c = sim_stream_ctx(s);
    if (!c || c->phys != x->phys)
        return CUDA_ERROR_INVALID_VALUE; /* graph memory lives on the graph's device */
    pthread_mutex_lock(&gmu);
    CUresult rc = map(x);
    pthread_mutex_unlock(&gmu);
    return rc;
}

void sim_graph_mem_launched(struct sim_graph *exec, struct sim_stream *s)
{
    struct sim_graph_mem *x = exec->mem;
    if (!x)
        return;
    pthread_mutex_lock(&sim.mu);
    struct sim_mark end = s->tail;
    pthread_mutex_unlock(&sim.mu);
    pthread_mutex_lock(&gmu);
    x->last_stream = s;
    x->last_end = end;
    for (size_t i = 0; i < x->n; i++) /* not freed in the graph: live until cuMemFree */
        x->nodes[i].live = !x->nodes[i].is_free && !freed_in_graph(x, i);
    pthread_mutex_unlock(&gmu);
}

void sim_graph_mem_destroy(struct sim_graph *g)
{
    struct sim_graph_mem *x = g->mem;
    if (!x)
        return;
    g->mem = NULL;
    if (!x->exec) {
        free(x->nodes);
        free(x);
        return;
    }
    pthread_mutex_lock(&gmu);
    x->destroyed = true; /* unlinked by a later trim, once nothing of it is live */
    if (!has_live(x)) /* allocations not freed yet keep their memory mapped */
        unmap(x);
    pthread_mutex_unlock(&gmu);
}

bool sim_graph_mem_free_outside(CUdeviceptr dptr)
{
    bool found = false;
    pthread_mutex_lock(&gmu);
    for (struct sim_graph_mem *x = reserve_gen == sim.gen ? execs : NULL; x && !found;
         x = x->next_exec)
        for (size_t i = 0; i < x->n && !found; i++)
            if (x->nodes[i].live && x->nodes[i].addr == dptr) {
                x->nodes[i].live = false;
                found = true;
                if (x->destroyed && !has_live(x))
                    unmap(x);
            }
    pthread_mutex_unlock(&gmu);
    return found;
}

/* ---- the device's graph reserve ---- */

SIM_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    unsigned phys;
    CUresult rc = sim_ordinal(device, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&gmu);
    struct graph_reserve *r = reserve_of(phys);
    for (struct sim_graph_mem **pp = &execs; *pp;) {
        struct sim_graph_mem *x = *pp;
        if (x->phys == phys && x->mapped && sim_mark_done(x->last_end) && !has_live(x))
            unmap(x); /* neither executing nor scheduled: its pages can go */
        if (x->destroyed && !x->mapped) {
            *pp = x->next_exec;
            free(x->nodes);
            free(x);
        } else {
            pp = &x->next_exec;
        }
    }
    if (r->reserved > r->used) {
        sim_uncharge_as(phys, SIM_MEM_GRAPH, r->reserved - r->used);
        r->reserved = r->used;
    }
    pthread_mutex_unlock(&gmu);
    return CUDA_SUCCESS;
}

/* Reads an attribute, or (set) resets a high-water mark: only those can be
 * set, and only to 0, which makes them the current value. */
static CUresult graph_attribute(CUdevice device, CUgraphMem_attribute attr, void *value, bool set)
{
    unsigned phys;
    CUresult rc = sim_ordinal(device, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!value || (set && *(cuuint64_t *)value != 0))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&gmu);
    struct graph_reserve *r = reserve_of(phys);
    cuuint64_t *v = value;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
        if (set)
            r->used_high = r->used;
        *v = r->used_high;
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        if (set)
            r->reserved_high = r->reserved;
        *v = r->reserved_high;
        break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        if (set)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            *v = attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT ? r->used : r->reserved;
        break;
    default: rc = CUDA_ERROR_INVALID_VALUE; break;
    }
    pthread_mutex_unlock(&gmu);
    return rc;
}

SIM_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                 void *value)
{
    return graph_attribute(device, attr, value, false);
}

SIM_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                 void *value)
{
    return graph_attribute(device, attr, value, true);
}

/* ---- graphs built node by node (memory nodes only) ---- */

SIM_EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *g = sim_graph_new(false);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

static CUresult check_node_args(CUgraphNode *phGraphNode, const CUgraphNode *dependencies,
                                size_t numDependencies)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    return !phGraphNode || (numDependencies && !dependencies) ? CUDA_ERROR_INVALID_VALUE
                                                             : CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                           const CUgraphNode *dependencies,
                                           size_t numDependencies,
                                           CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    unsigned phys;
    CUresult rc = check_node_args(phGraphNode, dependencies, numDependencies);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!nodeParams || nodeParams->bytesize == 0 ||
        nodeParams->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sim_ordinal(nodeParams->poolProps.location.id, &phys)) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim.mu);
    struct sim_graph *g = sim_graph_of(hGraph, false);
    rc = g ? alloc_node(g, nodeParams->poolProps.location.id, phys, nodeParams->bytesize,
                        &nodeParams->dptr, true)
           : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&sim.mu);
    if (rc == CUDA_SUCCESS)
        *phGraphNode = (CUgraphNode)(uintptr_t)sim_new_address(0, 0); /* opaque, unique */
    return rc;
}

SIM_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                          const CUgraphNode *dependencies, size_t numDependencies,
                                          CUdeviceptr dptr)
{
    CUresult rc = check_node_args(phGraphNode, dependencies, numDependencies);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    struct sim_graph *g = sim_graph_of(hGraph, false);
    rc = g ? free_node(g, dptr, true) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&sim.mu);
    if (rc == CUDA_SUCCESS)
        *phGraphNode = (CUgraphNode)(uintptr_t)sim_new_address(0, 0);
    return rc;
}

/* Maps the graph's memory now, so its first launch does not. */
static CUresult graph_upload(CUgraphExec hGraphExec, CUstream hStream, bool ptsz)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    struct sim_graph *x = sim_graph_of(hGraphExec, true);
    pthread_mutex_unlock(&sim.mu);
    return x ? sim_graph_mem_map(x, s) : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_upload(hGraphExec, hStream, false);
}

SIM_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_upload(hGraphExec, hStream, true);
}
