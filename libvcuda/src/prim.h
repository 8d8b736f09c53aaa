/* Operating-system primitives behind one small contract, so the rest of the
 * shim states what it needs and tests can reason about it.
 *
 * vcuda_prim_start_time(pid): the process's start time in clock ticks since
 *   boot (field 22 of /proc/<pid>/stat), 0 if the process does not exist or
 *   /proc is unreadable. Together with the pid it names one process for life,
 *   surviving pid reuse.
 * vcuda_prim_alive(pid, start_time): 1 if that very process still runs, else 0.
 *   A zero start_time is checked by pid alone.
 */
#ifndef VCUDA_PRIM_H
#define VCUDA_PRIM_H

#include <stdint.h>
#include <sys/types.h>

uint64_t vcuda_prim_start_time(pid_t pid);
int vcuda_prim_alive(pid_t pid, uint64_t start_time);

#endif
