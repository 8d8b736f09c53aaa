/* Graph memory: allocations made while a stream is being captured become
 * graph memory nodes, charged by the graphs that hold them (graph_mem.c). */
#ifndef VCUDA_GRAPH_MEM_H
#define VCUDA_GRAPH_MEM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "hooks.h"

/* Stream captures under way in this process: while 0, no allocation asks the
 * driver whether its stream is capturing. */
extern _Atomic int vcuda_captures_active;

bool vcuda_graph_mem_capturing_slow(CUstream stream, bool ptsz);

/* Whether an allocation or free on `stream` is captured into a graph (`ptsz`:
 * made through a per-thread-default-stream entry point). */
static inline bool vcuda_graph_mem_capturing(CUstream stream, bool ptsz) {
    return atomic_load_explicit(&vcuda_captures_active, memory_order_relaxed) != 0 &&
           vcuda_graph_mem_capturing_slow(stream, ptsz);
}

/* A captured allocation of `bytes` at `ptr`, and a captured free. */
void vcuda_graph_mem_captured_alloc(CUstream stream, bool ptsz, CUdeviceptr ptr, uint64_t bytes);
void vcuda_graph_mem_captured_free(CUstream stream, bool ptsz, CUdeviceptr ptr);

/* Trim before deny: gives this process's cached graph memory on ledger
 * device `dev` back to the driver; returns the bytes given back. */
uint64_t vcuda_graph_mem_trim(int dev);
void vcuda_graph_mem_reset_after_fork(void);

#endif
