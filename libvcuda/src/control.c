/* The vcuda_* control API (include/vcuda.h): thin forwards to the internal
 * modules, plus the library's constructor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "compute.h"
#include "context.h"
#include "ledger.h"
#include "log.h"
#include "prim.h"
#include "process.h"
#include "quota_file.h"
#include "real_driver.h"
#include "vcuda.h"

#ifndef VCUDA_VERSION
#error "VCUDA_VERSION must be defined by the build"
#endif

_Static_assert(VCUDA_LEDGER_DEVICES == VCUDA_MAX_DEVICES, "public and internal device counts differ");
_Static_assert(VCUDA_UUID_LEN == VCUDA_LEDGER_UUID_LEN, "public and internal uuid lengths differ");

struct vcuda_ledger_map {
    struct vcuda_ledger ledger;
};

VCUDA_API const char *vcuda_version(void) { return VCUDA_VERSION; }

VCUDA_API int vcuda_parse_quantity(const char *text, uint64_t *bytes, char *err, size_t errlen) {
    const char *why = NULL;
    if (text == NULL || bytes == NULL) {
        why = "no value";
    } else if (vcuda_quantity_parse(text, bytes, &why) == 0) {
        return 0;
    }
    if (err && errlen) snprintf(err, errlen, "%s", why);
    return -1;
}

VCUDA_API int vcuda_config_text(char *buf, size_t len) { return vcuda_config_describe(buf, len); }

VCUDA_API int vcuda_quota_parse(const char *text, size_t len, char *out, size_t outlen) {
    char fallback[8];
    if (out == NULL || outlen == 0) { out = fallback; outlen = sizeof fallback; }
    struct vcuda_quota_file *q = calloc(1, sizeof *q);
    if (q == NULL || text == NULL) {
        snprintf(out, outlen, "%s", q ? "no text given" : "out of memory");
        free(q);
        return -1;
    }
    int rc = vcuda_quota_file_parse(text, len, q, out, outlen);
    if (rc == 0) vcuda_quota_file_format(q, out, outlen);
    free(q);
    return rc;
}

VCUDA_API vcuda_ledger_map *vcuda_ledger_open_file(const char *path, int create, char *err, size_t errlen) {
    char fallback[8];
    if (err == NULL || errlen == 0) { err = fallback; errlen = sizeof fallback; }
    if (path == NULL || *path == '\0') {
        snprintf(err, errlen, "no ledger path given");
        return NULL;
    }
    vcuda_ledger_map *map = calloc(1, sizeof *map);
    if (map == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (vcuda_ledger_open(&map->ledger, path, create != 0, err, errlen) != 0) {
        free(map);
        return NULL;
    }
    return map;
}

VCUDA_API void vcuda_ledger_close_file(vcuda_ledger_map *map) {
    if (map == NULL) return;
    vcuda_ledger_close(&map->ledger);
    free(map);
}

VCUDA_API int vcuda_ledger_read_devices(vcuda_ledger_map *map, vcuda_device_usage *out, int max) {
    int n = 0;
    for (int i = 0; i < VCUDA_MAX_DEVICES && n < max; i++) {
        struct vcuda_ledger_device *d = &map->ledger.file->devices[i];
        if (atomic_load_explicit(&d->state, memory_order_acquire) != 2) continue;
        vcuda_device_usage *u = &out[n++];
        memcpy(u->uuid, d->uuid, sizeof u->uuid);
        u->uuid[sizeof u->uuid - 1] = '\0';
        u->index = i;
        u->reserved = 0;
        u->limit = atomic_load(&d->limit);
        u->used = atomic_load(&d->used);
        u->peak = atomic_load(&d->peak);
        u->oom_denials = atomic_load(&d->oom_denials);
        uint64_t overhead = atomic_load(&d->context_overhead);
        u->context_overhead = overhead == UINT64_MAX ? 0 : overhead; /* UINT64_MAX: unmeasurable */
        u->unattributed = atomic_load(&d->unattributed);
    }
    return n;
}

VCUDA_API int vcuda_ledger_read_processes(vcuda_ledger_map *map, vcuda_process_usage *out, int max) {
    int n = 0;
    for (int i = 0; i < VCUDA_LEDGER_MAX_PROCS && n < max; i++) {
        struct vcuda_ledger_proc *p = &map->ledger.file->procs[i];
        uint64_t owner = atomic_load_explicit(&p->owner, memory_order_acquire);
        if ((owner & 0xff) != VCUDA_SLOT_LIVE) continue;
        vcuda_process_usage *u = &out[n++];
        u->pid = (int32_t)(owner >> 8);
        u->start_time = atomic_load(&p->start_time);
        u->alive = vcuda_prim_alive(u->pid, u->start_time);
        for (int d = 0; d < VCUDA_MAX_DEVICES; d++) u->used[d] = atomic_load(&p->used[d]);
    }
    return n;
}

VCUDA_API int vcuda_ledger_reclaim_dead(vcuda_ledger_map *map) { return vcuda_ledger_reclaim(&map->ledger); }

VCUDA_API int vcuda_ledger_set_limit(vcuda_ledger_map *map, const char *uuid, uint64_t limit) {
    int dev = vcuda_ledger_device(&map->ledger, uuid);
    if (dev < 0) return -1;
    /* Pin first: a process naming the device now keeps this limit, not its own. */
    atomic_store(&map->ledger.file->devices[dev].limit_pinned, 1);
    atomic_store(&map->ledger.file->devices[dev].limit, limit);
    return 0;
}

VCUDA_API int vcuda_ledger_set_unattributed(vcuda_ledger_map *map, const char *uuid, uint64_t bytes) {
    int dev = vcuda_ledger_device(&map->ledger, uuid);
    if (dev < 0) return -1;
    vcuda_ledger_charge_unattributed(&map->ledger, dev, bytes);
    return 0;
}

/* Runs when the library is loaded: read the environment once, find glibc's
 * dlsym, index the hook table. Nothing here allocates or calls the driver. */
__attribute__((constructor)) static void vcuda_load(void) {
    vcuda_config_load();
    vcuda_real_dlsym_init();
    vcuda_hooks_init();
    vcuda_process_init();
    vcuda_compute_init();
    if (vcuda_log_threshold >= VCUDA_LOG_DEBUG) {
        char text[12288];
        vcuda_config_describe(text, sizeof text);
        vcuda_debug("libvcuda %s (release build), effective options:\n%s", VCUDA_VERSION, text);
    }
}
