/* State sim_tool.c shares with its command sets (sim_tool_mem.c). */
#ifndef SIM_TOOL_H
#define SIM_TOOL_H

#include "api.h"

#define MAXP 4096

extern CUdeviceptr ptrs[MAXP]; /* allocations, in order; 0 once freed by index */
extern int nptr;
extern CUstream stream; /* NULL: the legacy default stream */

unsigned long long qty(const char *s); /* 12, 4K, 100M, 1G */
CUresult launch_fn(CUfunction f, unsigned long long us); /* on `stream`, us microseconds */

/* Runs the memory-mechanism command at argv[*i] (pools, local memory and
 * limits, modules, graph memory, sharing), advancing *i past its arguments.
 * Returns 0 when argv[*i] is not one of them. */
int sim_tool_mem(int argc, char **argv, int *i);

#endif
