/* The shared state file: creation, validation, the robust lock, process slots
 * and reclaiming what dead processes held (as a real driver does at exit). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

static void init_shared(struct sim_shared *sh, const struct sim_config *cfg, bool fresh)
{
    if (!fresh) /* a new file reads as zeros: writing them would allocate all of it */
        memset(sh, 0, sizeof *sh);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&sh->lock, &a);
    pthread_mutexattr_destroy(&a);
    sh->version = SIM_VERSION;
    sh->size = (uint32_t)sizeof *sh;
    sh->ndev = cfg->ndev;
    sh->max_pending = cfg->max_pending;
    sh->ctx_overhead = cfg->ctx_overhead;
    sh->timeslice_ns = cfg->timeslice_ns;
    sh->driver_version = cfg->driver_version;
    sh->next_addr = SIM_ADDR_BASE;
    sh->nvswitch = cfg->nvswitch;
    sh->sms = cfg->sms;
    sh->threads_per_sm = cfg->threads_per_sm;
    sh->pool_chunk = cfg->pool_chunk;
    sh->kernel_code = cfg->kernel_code;
    sh->mig_model = cfg->mig_model;
    const struct sim_mig_model *m = sim_mig_model(sh);
    for (unsigned i = 0; i < cfg->ndev; i++) {
        struct sim_device *d = &sh->dev[i];
        memcpy(d->uuid, cfg->uuid[i], SIM_STR);
        memcpy(d->name, cfg->name[i], SIM_STR);
        d->capacity = cfg->memory;
        d->sms = cfg->sms;
        d->numa_node = cfg->numa[i];
        d->nvlink_peers = cfg->nvlink_peers[i];
        d->rr_slot = -1;
        sh->mig[i] = cfg->mig[i];
        if (!cfg->mig[i].capable)
            continue;
        /* A MIG-capable device is the model's GPU. */
        d->capacity = m->memory;
        d->sms = m->sms;
        if (!cfg->names_set)
            snprintf(d->name, SIM_STR, "%s", m->name);
        for (unsigned k = 0; k < SIM_MIG_MAX; k++) {
            if (sh->mig[i].gi[k].live) {
                sh->mig[i].gi[k].serial = ++sh->mig_serial;
                sim_mig_device_init(sh, i, k);
            }
        }
    }
    /* Readers check the magic after taking the flock; the release store keeps
     * a crashed creator's half-written file recognisable (magic still 0). */
    __atomic_store_n(&sh->magic, SIM_MAGIC, __ATOMIC_RELEASE);
}

static int make_parent_dir(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

struct sim_shared *sim_state_open(const char *path, bool create, char *err, size_t errlen)
{
    if (create && make_parent_dir(path) != 0) {
        snprintf(err, errlen, "cannot create the directory of %s: %s", path, strerror(errno));
        return NULL;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct sim_shared *sh = NULL;
    /* The flock serialises creation; a creator killed midway releases it and
     * leaves magic 0, so the next opener initialises the file again. */
    if (flock(fd, LOCK_EX) != 0) {
        snprintf(err, errlen, "cannot lock %s: %s", path, strerror(errno));
        goto out;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        goto out;
    }
    bool fresh = st.st_size == 0;
    if (fresh || (size_t)st.st_size == sizeof *sh) {
        if (fresh && ftruncate(fd, sizeof *sh) != 0) {
            snprintf(err, errlen, "cannot size %s: %s", path, strerror(errno));
            goto out;
        }
    } else if ((size_t)st.st_size < 16) {
        snprintf(err, errlen, "%s is not a vcuda simulator state file (%lld bytes)", path,
                 (long long)st.st_size);
        goto out;
    }
    size_t maplen = fresh ? sizeof *sh : (size_t)st.st_size;
    void *m = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
        goto out;
    }
    sh = m;
    uint64_t magic = __atomic_load_n(&sh->magic, __ATOMIC_ACQUIRE);
    if (magic == 0 && maplen == sizeof *sh) {
        struct sim_config cfg;
        char cerr[256];
        if (sim_config_from_env(&cfg, cerr, sizeof cerr) != 0) {
            snprintf(err, errlen, "bad simulator configuration: %s", cerr);
            munmap(m, maplen);
            sh = NULL;
            goto out;
        }
        init_shared(sh, &cfg, fresh);
    } else if (magic != SIM_MAGIC) {
        snprintf(err, errlen, "%s is not a vcuda simulator state file (bad magic)", path);
        munmap(m, maplen);
        sh = NULL;
    } else if (sh->version != SIM_VERSION || sh->size != sizeof *sh || maplen != sizeof *sh) {
        snprintf(err, errlen,
                 "%s has simulator state version %u (%u bytes); this library needs "
                 "version %u (%zu bytes): remove the file or use another VCUDA_SIM_STATE",
                 path, sh->version, sh->size, SIM_VERSION, sizeof *sh);
        munmap(m, maplen);
        sh = NULL;
    }
out:
    /* The mapping keeps the open file description, and with it the flock, alive
     * after close(): unlock explicitly, or the next opener waits forever. */
    flock(fd, LOCK_UN);
    close(fd);
    return sh;
}

void sim_state_close(struct sim_shared *sh)
{
    if (sh)
        munmap(sh, sizeof *sh);
}

void sim_lock(struct sim_shared *sh)
{
    int rc = pthread_mutex_lock(&sh->lock);
    if (rc == EOWNERDEAD) {
        /* The holder died. Every update under the lock is a single store or
         * leaves derived totals intact, so the state is usable as is. */
        pthread_mutex_consistent(&sh->lock);
        sim_reap_dead(sh);
    }
}

void sim_unlock(struct sim_shared *sh)
{
    pthread_mutex_unlock(&sh->lock);
}

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A real driver's synchronize returns within a microsecond of the work's
 * completion: it busy-waits (a context's default CU_CTX_SCHED_AUTO with fewer
 * contexts than CPUs, SPIN or YIELD; an event without CU_EVENT_BLOCKING_SYNC).
 * A spinning wait sleeps until `spin_ns` (VCUDA_SIM_SPIN_US) before its time,
 * which hides the wake-up (tens of microseconds on a busy or virtual machine),
 * and spins the rest: the same return, without a core per waiting thread. A
 * blocking one (spin_ns 0: CU_CTX_SCHED_BLOCKING_SYNC, CU_EVENT_BLOCKING_SYNC)
 * wakes as the OS wakes it, within 1 us of timer slack rather than the default
 * 50 us (the calling thread's own slack is restored). */
void sim_sleep_until(uint64_t t_ns, uint64_t spin_ns)
{
    uint64_t wake = t_ns > spin_ns ? t_ns - spin_ns : 0;
    struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ull),
                          .tv_nsec = (long)(wake % 1000000000ull)};
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > 1000)
        prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    if (slack > 1000)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    while (spin_ns && sim_now_ns() < t_ns) {
    }
}

/* Start time (clock ticks since boot) of a live process, or 0 if it is gone
 * or a zombie: a zombie has released its GPU resources on a real driver. */
static uint64_t proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may contain spaces and parens */
    if (!p || p[1] != ' ')
        return 0;
    char state = p[2];
    if (state == 'Z' || state == 'X' || state == 'x')
        return 0;
    /* Fields after comm: 3 state ... 22 starttime. */
    p += 2;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

/* VCUDA_SIM_PID_NAMESPACE: the pid namespace (/proc/self/ns/pid, "pid:[N]") the
 * simulator's pids are valid in - the node agent's, which hands the simulator to
 * containers (node_state/gpu_driver.py). Pids are learnt with getpid(): a process
 * in another namespace would be booked under a pid NVML must not report and that
 * processes of other namespaces would find dead (and reap). A real driver learns
 * host pids in the kernel; the simulator refuses instead of booking wrongly. */
int sim_check_pid_namespace(const char *who)
{
    const char *want = getenv("VCUDA_SIM_PID_NAMESPACE");
    char have[128];
    if (!want || !*want)
        return 0;
    ssize_t n = readlink("/proc/self/ns/pid", have, sizeof have - 1);
    if (n < 0) {
        fprintf(stderr, "%s: cannot read /proc/self/ns/pid to check VCUDA_SIM_PID_NAMESPACE: %s\n",
                who, strerror(errno));
        return -1;
    }
    have[n] = '\0';
    if (strcmp(have, want) != 0) {
        fprintf(stderr, "%s: this process runs in pid namespace %s, the simulator's pids are those of %s "
                        "(VCUDA_SIM_PID_NAMESPACE): the simulator cannot learn host pids as a driver does; "
                        "run the container in the host's pid namespace (hostPID: true, podman --pid=host)\n",
                who, have, want);
        return -1;
    }
    return 0;
}

bool sim_proc_alive(const struct sim_proc *pr)
{
    if (kill(pr->pid, 0) != 0 && errno == ESRCH)
        return false;
    return proc_start_time(pr->pid) == pr->start_time;
}

int sim_proc_attach(struct sim_shared *sh, pid_t pid)
{
    uint64_t st = proc_start_time(pid);
    int free_slot = -1;
    for (uint32_t i = 0; i < sh->nproc_hw; i++) {
        struct sim_proc *pr = &sh->proc[i];
        if (pr->pid == pid && pr->start_time == st) {
            /* Same process, new image (exec keeps pid and start time): what the
             * old image held is gone, as a real driver frees it at exec. */
            free_slot = (int)i;
            break;
        }
        if (pr->pid == 0 && free_slot < 0)
            free_slot = (int)i;
    }
    if (free_slot < 0) {
        if (sh->nproc_hw < SIM_MAX_PROCS) {
            free_slot = (int)sh->nproc_hw;
        } else {
            sim_reap_dead(sh);
            for (uint32_t i = 0; i < sh->nproc_hw && free_slot < 0; i++)
                if (sh->proc[i].pid == 0)
                    free_slot = (int)i;
            if (free_slot < 0)
                return -1;
        }
    }
    struct sim_proc *pr = &sh->proc[free_slot];
    memset(pr, 0, sizeof *pr);
    pr->start_time = st;
    pr->host_pid = pid; /* the caller may set another (a simulated pid namespace) */
    pr->pid = pid; /* last: the slot counts from here on */
    if ((uint32_t)free_slot >= sh->nproc_hw)
        sh->nproc_hw = (uint32_t)free_slot + 1;
    return free_slot;
}

void sim_proc_release(struct sim_shared *sh, int slot)
{
    if (slot < 0 || slot >= SIM_MAX_PROCS)
        return;
    /* Credit the work it was served until now; what it still had queued
     * is dropped with it, as a context's pending work is at exit. */
    sim_sched_advance_all(sh, sim_now_ns());
    sh->proc[slot].pid = 0; /* one store frees its memory from the books */
}

void sim_reap_dead(struct sim_shared *sh)
{
    for (uint32_t i = 0; i < sh->nproc_hw; i++)
        if (sh->proc[i].pid != 0 && !sim_proc_alive(&sh->proc[i]))
            sh->proc[i].pid = 0;
}

uint64_t sim_device_used(const struct sim_shared *sh, unsigned phys)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < sh->nproc_hw; i++)
        if (sh->proc[i].pid != 0)
            used += sh->proc[i].used[phys];
    return used;
}
