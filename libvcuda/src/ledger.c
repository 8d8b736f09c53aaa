#include "ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device_uuid.h"
#include "prim.h"

#define OWNER(pid, state) (((uint64_t)(uint32_t)(pid) << 8) | (uint64_t)(state))
#define OWNER_PID(owner) ((pid_t)((owner) >> 8))
#define OWNER_STATE(owner) ((unsigned)((owner)&0xff))

static void init_header(struct vcuda_ledger_file *f) {
    struct vcuda_ledger_header *h = &f->header;
    memcpy(h->magic, VCUDA_LEDGER_MAGIC, 8);
    h->version = VCUDA_LEDGER_VERSION;
    h->header_size = sizeof(struct vcuda_ledger_header);
    h->device_size = sizeof(struct vcuda_ledger_device);
    h->proc_size = sizeof(struct vcuda_ledger_proc);
    h->max_devices = VCUDA_MAX_DEVICES;
    h->max_procs = VCUDA_LEDGER_MAX_PROCS;
    h->file_size = sizeof(struct vcuda_ledger_file);
    atomic_store_explicit(&h->ready, 1, memory_order_release);
}

static const char *check_header(const struct vcuda_ledger_header *h) {
    if (memcmp(h->magic, VCUDA_LEDGER_MAGIC, 8) != 0) return "it is not a vcuda ledger (bad magic)";
    if (h->version != VCUDA_LEDGER_VERSION) return "it has another ledger version";
    if (h->header_size != sizeof(struct vcuda_ledger_header) ||
        h->device_size != sizeof(struct vcuda_ledger_device) ||
        h->proc_size != sizeof(struct vcuda_ledger_proc) || h->max_devices != VCUDA_MAX_DEVICES ||
        h->max_procs != VCUDA_LEDGER_MAX_PROCS || h->file_size != sizeof(struct vcuda_ledger_file))
        return "its layout differs from this libvcuda's";
    if (atomic_load_explicit(&h->ready, memory_order_acquire) != 1) return "it was never completely initialised";
    return NULL;
}

int vcuda_ledger_open(struct vcuda_ledger *ledger, const char *path, bool create, char *err,
                      size_t errlen) {
    memset(ledger, 0, sizeof *ledger);
    const size_t size = sizeof(struct vcuda_ledger_file);
    if (path == NULL || *path == '\0') {
        /* MAP_SHARED so forked children keep charging the same (process-private) ledger. */
        void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) {
            snprintf(err, errlen, "cannot map a private ledger: %s", strerror(errno));
            return -1;
        }
        ledger->file = mem;
        init_header(ledger->file);
        return 0;
    }
    snprintf(ledger->path, sizeof ledger->path, "%s", path);
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open ledger %s: %s", path, strerror(errno));
        return -1;
    }
    /* Only creation is serialised; everything after it is lock-free. */
    if (flock(fd, LOCK_EX) != 0) {
        snprintf(err, errlen, "cannot lock ledger %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct stat st;
    int rc = -1;
    void *mem = MAP_FAILED;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot stat ledger %s: %s", path, strerror(errno));
        goto out;
    }
    bool fresh = st.st_size == 0;
    if (fresh && !create) {
        snprintf(err, errlen, "ledger %s is empty", path);
        goto out;
    }
    if (!fresh && (size_t)st.st_size != size) {
        snprintf(err, errlen, "refusing ledger %s: it is %lld bytes, a vcuda ledger is %zu", path,
                 (long long)st.st_size, size);
        goto out;
    }
    if (fresh && ftruncate(fd, (off_t)size) != 0) {
        snprintf(err, errlen, "cannot size ledger %s: %s", path, strerror(errno));
        goto out;
    }
    mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        snprintf(err, errlen, "cannot map ledger %s: %s", path, strerror(errno));
        goto out;
    }
    ledger->file = mem;
    if (fresh) {
        init_header(ledger->file);
    } else {
        const char *why = check_header(&ledger->file->header);
        if (why) {
            snprintf(err, errlen, "refusing ledger %s: %s", path, why);
            munmap(mem, size);
            ledger->file = NULL;
            goto out;
        }
    }
    rc = 0;
out:
    flock(fd, LOCK_UN);
    close(fd);
    return rc;
}

void vcuda_ledger_close(struct vcuda_ledger *ledger) {
    if (ledger->file) munmap(ledger->file, sizeof(struct vcuda_ledger_file));
    ledger->file = NULL;
}

/* One device, however it is named (device_uuid.h: GPU-/MIG- spellings of one MIG instance). */
static bool same_device(const char *a, const char *b) {
    return vcuda_same_device(a, b, VCUDA_LEDGER_UUID_LEN);
}

int vcuda_ledger_find_device(const struct vcuda_ledger *ledger, const char *uuid) {
    for (int i = 0; i < VCUDA_MAX_DEVICES; i++) {
        const struct vcuda_ledger_device *d = &ledger->file->devices[i];
        if (atomic_load_explicit(&d->state, memory_order_acquire) == 2 && same_device(d->uuid, uuid))
            return i;
    }
    return -1;
}

int vcuda_ledger_device(struct vcuda_ledger *ledger, const char *uuid) {
    for (;;) {
        int found = vcuda_ledger_find_device(ledger, uuid);
        if (found >= 0) return found;
        int claimed = -1;
        bool busy = false;
        for (int i = 0; i < VCUDA_MAX_DEVICES && claimed < 0; i++) {
            struct vcuda_ledger_device *d = &ledger->file->devices[i];
            uint32_t expected = 0;
            if (atomic_compare_exchange_strong(&d->state, &expected, 1)) claimed = i;
            else if (expected == 1) busy = true;
        }
        if (claimed < 0) {
            if (!busy) return -1;
            continue; /* another process is naming a device right now: look again */
        }
        struct vcuda_ledger_device *d = &ledger->file->devices[claimed];
        snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
        atomic_store(&d->limit, VCUDA_UNLIMITED);
        atomic_store_explicit(&d->state, 2, memory_order_release);
        /* Two processes may have claimed slots for the same uuid at once: the
         * lower index wins, the other slot is given back unused. */
        for (int i = 0; i < claimed; i++) {
            struct vcuda_ledger_device *o = &ledger->file->devices[i];
            if (atomic_load(&o->state) == 2 && same_device(o->uuid, uuid)) {
                memset(d->uuid, 0, sizeof d->uuid);
                atomic_store_explicit(&d->state, 0, memory_order_release);
                return i;
            }
        }
        return claimed;
    }
}

/* Returns the slot's usage to the devices and frees it; the caller owns the slot
 * (its own, or one it moved to RECLAIMING). */
static void drain_slot(struct vcuda_ledger *ledger, struct vcuda_ledger_proc *p) {
    for (int d = 0; d < VCUDA_MAX_DEVICES; d++) {
        uint64_t used = atomic_exchange(&p->used[d], 0);
        if (used) atomic_fetch_sub(&ledger->file->devices[d].used, used);
    }
    atomic_store(&p->start_time, 0);
    atomic_store_explicit(&p->owner, 0, memory_order_release);
}

int vcuda_ledger_attach(struct vcuda_ledger *ledger, pid_t pid, uint64_t start_time) {
    /* exec keeps pid and start time but the driver freed the old image's memory:
     * a slot that names this very process belongs to a previous image. */
    for (int i = 0; i < VCUDA_LEDGER_MAX_PROCS; i++) {
        struct vcuda_ledger_proc *p = &ledger->file->procs[i];
        uint64_t owner = atomic_load(&p->owner);
        if (OWNER_STATE(owner) != VCUDA_SLOT_LIVE || OWNER_PID(owner) != pid ||
            atomic_load(&p->start_time) != start_time)
            continue;
        if (atomic_compare_exchange_strong(&p->owner, &owner, OWNER(pid, VCUDA_SLOT_RECLAIMING)))
            drain_slot(ledger, p);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < VCUDA_LEDGER_MAX_PROCS; i++) {
            struct vcuda_ledger_proc *p = &ledger->file->procs[i];
            uint64_t expected = 0;
            if (!atomic_compare_exchange_strong(&p->owner, &expected, OWNER(pid, VCUDA_SLOT_CLAIMING)))
                continue;
            atomic_store(&p->start_time, start_time);
            for (int d = 0; d < VCUDA_MAX_DEVICES; d++) atomic_store(&p->used[d], 0);
            atomic_store_explicit(&p->owner, OWNER(pid, VCUDA_SLOT_LIVE), memory_order_release);
            return i;
        }
        if (vcuda_ledger_reclaim(ledger) == 0) break;
    }
    return -1;
}

void vcuda_ledger_detach(struct vcuda_ledger *ledger, int slot) {
    if (slot < 0 || ledger->file == NULL) return;
    drain_slot(ledger, &ledger->file->procs[slot]);
}

int vcuda_ledger_reclaim(struct vcuda_ledger *ledger) {
    int reclaimed = 0;
    for (int i = 0; i < VCUDA_LEDGER_MAX_PROCS; i++) {
        struct vcuda_ledger_proc *p = &ledger->file->procs[i];
        uint64_t owner = atomic_load_explicit(&p->owner, memory_order_acquire);
        if (owner == 0 || OWNER_STATE(owner) == VCUDA_SLOT_RECLAIMING) continue;
        pid_t pid = OWNER_PID(owner);
        uint64_t start = atomic_load(&p->start_time);
        /* A slot still being claimed has no start time yet: judge by pid alone. */
        if (vcuda_prim_alive(pid, OWNER_STATE(owner) == VCUDA_SLOT_LIVE ? start : 0)) continue;
        /* Exactly one reclaimer wins the slot. */
        if (!atomic_compare_exchange_strong(&p->owner, &owner, OWNER(pid, VCUDA_SLOT_RECLAIMING)))
            continue;
        drain_slot(ledger, p);
        reclaimed++;
    }
    return reclaimed;
}

static void raise_peak(struct vcuda_ledger_device *d, uint64_t now) {
    uint64_t peak = atomic_load_explicit(&d->peak, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&d->peak, &peak, now, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

static bool try_reserve(struct vcuda_ledger_device *d, uint64_t bytes, uint64_t limit) {
    uint64_t used = atomic_load_explicit(&d->used, memory_order_relaxed);
    for (;;) {
        if (bytes > limit || used > limit - bytes) return false;
        if (atomic_compare_exchange_weak_explicit(&d->used, &used, used + bytes,
                                                  memory_order_acq_rel, memory_order_relaxed))
            break;
    }
    raise_peak(d, used + bytes);
    return true;
}

bool vcuda_ledger_reserve_quiet(struct vcuda_ledger *ledger, int slot, int dev, uint64_t bytes,
                                uint64_t limit) {
    struct vcuda_ledger_device *d = &ledger->file->devices[dev];
    /* A dead process's usage is returned before anyone is refused. */
    if (!try_reserve(d, bytes, limit) && (vcuda_ledger_reclaim(ledger) == 0 || !try_reserve(d, bytes, limit)))
        return false;
    atomic_fetch_add_explicit(&ledger->file->procs[slot].used[dev], bytes, memory_order_relaxed);
    return true;
}

void vcuda_ledger_count_denial(struct vcuda_ledger *ledger, int dev) {
    atomic_fetch_add_explicit(&ledger->file->devices[dev].oom_denials, 1, memory_order_relaxed);
}

bool vcuda_ledger_reserve(struct vcuda_ledger *ledger, int slot, int dev, uint64_t bytes,
                          uint64_t limit) {
    if (vcuda_ledger_reserve_quiet(ledger, slot, dev, bytes, limit)) return true;
    vcuda_ledger_count_denial(ledger, dev);
    return false;
}

void vcuda_ledger_charge_unattributed(struct vcuda_ledger *ledger, int dev, uint64_t bytes) {
    struct vcuda_ledger_device *d = &ledger->file->devices[dev];
    uint64_t old = atomic_exchange_explicit(&d->unattributed, bytes, memory_order_acq_rel);
    if (bytes > old)
        raise_peak(d, atomic_fetch_add_explicit(&d->used, bytes - old, memory_order_acq_rel) + bytes - old);
    else if (old > bytes)
        atomic_fetch_sub_explicit(&d->used, old - bytes, memory_order_acq_rel);
}

void vcuda_ledger_release(struct vcuda_ledger *ledger, int slot, int dev, uint64_t bytes) {
    atomic_fetch_sub_explicit(&ledger->file->procs[slot].used[dev], bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&ledger->file->devices[dev].used, bytes, memory_order_acq_rel);
}
