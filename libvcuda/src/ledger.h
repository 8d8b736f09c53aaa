/* The container's memory ledger: one mmap'ed file shared by every process of
 * the container (DESIGN.md "Ledger"). Per device a limit and a used counter,
 * per process a slot (pid + start time) with its usage, so the usage of a dead
 * process can be reclaimed. All counters are lock-free atomics; a lock (flock)
 * is taken only while a new file is initialised.
 *
 * The layout is versioned: a reader refuses a file whose magic, version or
 * sizes differ from its own.
 */
#ifndef VCUDA_LEDGER_H
#define VCUDA_LEDGER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"

#define VCUDA_LEDGER_MAGIC "VCUDALDG"
#define VCUDA_LEDGER_VERSION 1u
#define VCUDA_LEDGER_MAX_PROCS 1024
#define VCUDA_LEDGER_UUID_LEN 48

struct vcuda_ledger_device {
    _Atomic uint32_t state; /* 0 free, 1 being claimed, 2 ready */
    uint32_t reserved0;
    char uuid[VCUDA_LEDGER_UUID_LEN];
    _Atomic uint64_t limit; /* bytes; VCUDA_UNLIMITED when none */
    _Atomic uint64_t used;
    _Atomic uint64_t peak;
    _Atomic uint64_t oom_denials;
    _Atomic uint64_t context_overhead; /* measured bytes per context, 0 = not yet known */
    _Atomic uint64_t overhead_measurer; /* pid measuring it now, 0 = nobody */
    /* 1: `limit` was set through vcuda_ledger_set_limit (the device plugin, live
     * quota changes) and wins over every process's VCUDA_MEMORY_LIMIT. */
    _Atomic uint64_t limit_pinned;
    /* Bytes the memory reconciler found on the GPU that no hook charged (lazy
     * module code, context growth, processes without the shim): included in
     * `used`, so every later reservation must fit beneath it. Only
     * vcuda_ledger_charge_unattributed writes it (the node agent, `vcuda run`);
     * it was reserved[0] before, so the layout and version are unchanged. */
    _Atomic uint64_t unattributed;
    uint64_t reserved[8];
};

/* owner = pid << 8 | state, so pid and state change together in one CAS. */
enum { VCUDA_SLOT_FREE = 0, VCUDA_SLOT_CLAIMING = 1, VCUDA_SLOT_LIVE = 2, VCUDA_SLOT_RECLAIMING = 3 };

struct vcuda_ledger_proc {
    _Atomic uint64_t owner;
    _Atomic uint64_t start_time;
    _Atomic uint64_t used[VCUDA_MAX_DEVICES];
};

struct vcuda_ledger_header {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint32_t device_size;
    uint32_t proc_size;
    uint32_t max_devices;
    uint32_t max_procs;
    uint64_t file_size;
    _Atomic uint32_t ready;
    uint32_t reserved0;
    uint64_t reserved[8];
};

struct vcuda_ledger_file {
    struct vcuda_ledger_header header;
    struct vcuda_ledger_device devices[VCUDA_MAX_DEVICES];
    struct vcuda_ledger_proc procs[VCUDA_LEDGER_MAX_PROCS];
};

struct vcuda_ledger {
    struct vcuda_ledger_file *file;
    char path[4096]; /* empty for a process-private ledger */
};

/* Map the ledger at `path` (creating it if absent and `create`), or a private
 * anonymous one when path is NULL/empty. On failure returns -1 and a message
 * naming the path in `err`. */
int vcuda_ledger_open(struct vcuda_ledger *ledger, const char *path, bool create, char *err,
                      size_t errlen);
void vcuda_ledger_close(struct vcuda_ledger *ledger);

/* Device record for `uuid`, claimed if new. Returns its index or -1 when full. */
int vcuda_ledger_device(struct vcuda_ledger *ledger, const char *uuid);
/* Index of the device record for `uuid`, or -1. */
int vcuda_ledger_find_device(const struct vcuda_ledger *ledger, const char *uuid);

/* Claim a process slot for (pid, start_time); -1 when none is free. */
int vcuda_ledger_attach(struct vcuda_ledger *ledger, pid_t pid, uint64_t start_time);
/* Give back a slot, releasing whatever usage it still holds. */
void vcuda_ledger_detach(struct vcuda_ledger *ledger, int slot);

/* Charge `bytes` on device `dev` to `slot` if it fits under `limit` (the
 * caller's view of the limit, VCUDA_UNLIMITED for none). Reclaims dead
 * processes' usage once before refusing. */
bool vcuda_ledger_reserve(struct vcuda_ledger *ledger, int slot, int dev, uint64_t bytes,
                          uint64_t limit);
/* The same without counting a refusal as an OOM denial: for a caller that
 * tries again (trim before deny, quota.c). */
bool vcuda_ledger_reserve_quiet(struct vcuda_ledger *ledger, int slot, int dev, uint64_t bytes,
                                uint64_t limit);
void vcuda_ledger_count_denial(struct vcuda_ledger *ledger, int dev);
void vcuda_ledger_release(struct vcuda_ledger *ledger, int slot, int dev, uint64_t bytes);

/* Makes the device's unattributed charge `bytes`, moving `used` by the
 * difference (it may then exceed the limit: the memory is in use). */
void vcuda_ledger_charge_unattributed(struct vcuda_ledger *ledger, int dev, uint64_t bytes);

/* Release the usage of every slot whose process is gone. Returns how many. */
int vcuda_ledger_reclaim(struct vcuda_ledger *ledger);

#endif
