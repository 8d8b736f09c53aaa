/* VCUDA_SIM_* configuration, read once when a process creates the state file.
 * Later processes take the configuration from the file, not from their env. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

/* Bytes or a Kubernetes-style quantity: 512Mi, 16Gi, 4G, 1.5Gi, 1024k. */
int sim_parse_quantity(const char *s, uint64_t *out)
{
    static const struct { const char *suffix; double mult; } units[] = {
        {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0},
        {"Ti", 1099511627776.0}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6},
        {"G", 1e9}, {"T", 1e12}, {"", 1.0},
    };
    if (!s || !*s || *s == '-' || isspace((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (b >= 18446744073709551615.0)
                return -1;
            *out = (uint64_t)b;
            return 0;
        }
    }
    return -1;
}

static int env_u64(const char *name, uint64_t dflt, uint64_t *out, char *err, size_t errlen)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = dflt;
        return 0;
    }
    if (sim_parse_quantity(v, out) != 0) {
        snprintf(err, errlen, "%s=%s is not a number or quantity (like 512Mi, 16Gi)", name, v);
        return -1;
    }
    return 0;
}

/* Splits a comma list into fixed slots; missing entries keep their default. */
static void split_list(const char *list, char dst[][SIM_STR], unsigned n)
{
    if (!list || !*list)
        return;
    const char *p = list;
    for (unsigned i = 0; i < n && p; i++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len > 0) {
            if (len >= SIM_STR)
                len = SIM_STR - 1;
            memcpy(dst[i], p, len);
            dst[i][len] = '\0';
        }
        p = comma ? comma + 1 : NULL;
    }
}

/* VCUDA_SIM_NUMA=0,0,1,1: the NUMA node of each device (-1: none); unset:
 * no NUMA information at all. A list shorter than the devices is an error. */
static int parse_numa(const char *list, struct sim_config *cfg, char *err, size_t errlen)
{
    for (unsigned i = 0; i < cfg->ndev; i++)
        cfg->numa[i] = -1;
    if (!list || !*list)
        return 0;
    const char *p = list;
    for (unsigned i = 0; i < cfg->ndev; i++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < -1 || v > 1023 || (*end != ',' && *end != '\0')) {
            snprintf(err, errlen, "VCUDA_SIM_NUMA=%s: entry %u is not a NUMA node (-1..1023)",
                     list, i);
            return -1;
        }
        cfg->numa[i] = (int32_t)v;
        if (*end == '\0') {
            if (i + 1 != cfg->ndev) {
                snprintf(err, errlen, "VCUDA_SIM_NUMA=%s: %u entries for %u devices", list,
                         i + 1, cfg->ndev);
                return -1;
            }
            return 0;
        }
        p = end + 1;
    }
    snprintf(err, errlen, "VCUDA_SIM_NUMA=%s: more entries than the %u devices", list,
             cfg->ndev);
    return -1;
}

/* VCUDA_SIM_NVLINK=0-1,2-3: one NVLink between each pair of devices;
 * VCUDA_SIM_NVLINK=switch: every device on one NVSwitch fabric. */
static int parse_nvlink(const char *list, struct sim_config *cfg, char *err, size_t errlen)
{
    if (!list || !*list)
        return 0;
    if (strcmp(list, "switch") == 0) {
        cfg->nvswitch = true;
        return 0;
    }
    const char *p = list;
    for (;;) {
        char *end;
        errno = 0;
        unsigned long a = strtoul(p, &end, 10), b = 0;
        bool ok = !errno && end != p && *end == '-' && isdigit((unsigned char)p[0]);
        if (ok) {
            p = end + 1;
            b = strtoul(p, &end, 10);
            ok = !errno && end != p && isdigit((unsigned char)p[0]) &&
                 (*end == ',' || *end == '\0');
        }
        if (!ok || a >= cfg->ndev || b >= cfg->ndev || a == b) {
            snprintf(err, errlen,
                     "VCUDA_SIM_NVLINK=%s: want pairs of distinct device indexes below %u, "
                     "like 0-1,2-3, or switch", list, cfg->ndev);
            return -1;
        }
        cfg->nvlink_peers[a] |= 1u << b;
        cfg->nvlink_peers[b] |= 1u << a;
        if (*end == '\0')
            return 0;
        p = end + 1;
    }
}

/* VCUDA_SIM_MIG_MODEL: the profile table of MIG-capable devices. */
static int parse_mig_model(const char *key, struct sim_config *cfg, char *err, size_t errlen)
{
    if (!key || !*key)
        key = sim_mig_models[0].key;
    for (unsigned i = 0; i < sim_mig_nmodels; i++) {
        if (strcmp(sim_mig_models[i].key, key) == 0) {
            cfg->mig_model = i;
            return 0;
        }
    }
    snprintf(err, errlen, "VCUDA_SIM_MIG_MODEL=%s: want h100-80gb or a100-40gb", key);
    return -1;
}

/* One VCUDA_SIM_MIG entry: "" (not MIG-capable), "off", "on" or
 * "on:1g.10gb,3g.40gb" (GPU instances, each with its compute instance,
 * created in order, each at the highest free placement). */
static int parse_mig_entry(const char *e, size_t len, unsigned dev, struct sim_config *cfg,
                           char *err, size_t errlen)
{
    struct sim_mig *mig = &cfg->mig[dev];
    const struct sim_mig_model *m = &sim_mig_models[cfg->mig_model];
    if (len == 0)
        return 0;
    mig->capable = 1;
    if (len == 3 && strncmp(e, "off", 3) == 0)
        return 0;
    if (len < 2 || strncmp(e, "on", 2) != 0 || (len > 2 && e[2] != ':')) {
        snprintf(err, errlen, "VCUDA_SIM_MIG entry %u (%.*s): want off, on or on:<profiles>",
                 dev, (int)len, e);
        return -1;
    }
    mig->mode = 1;
    const char *end = e + len;
    for (const char *p = e + 3; len > 2 && p < end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        size_t n = comma ? (size_t)(comma - p) : (size_t)(end - p);
        int prof = sim_mig_profile_by_name(m, p, n);
        unsigned start, k;
        for (k = 0; k < SIM_MIG_MAX && mig->gi[k].live; k++) {
        }
        if (prof < 0) {
            snprintf(err, errlen, "VCUDA_SIM_MIG entry %u: no profile %.*s on a %s", dev,
                     (int)n, p, m->key);
            return -1;
        }
        if (sim_gi_place(mig, m, (unsigned)prof, -1, &start) != SIM_MIG_OK) {
            snprintf(err, errlen, "VCUDA_SIM_MIG entry %u: %.*s does not fit beside the "
                     "instances before it", dev, (int)n, p);
            return -1;
        }
        unsigned size = m->profiles[prof].mem_slices;
        mig->gi[k] = (struct sim_gi){.live = 1, .profile = (unsigned)prof, .start = start,
                                     .size = size, .id = sim_gi_id(start, size), .ci_live = 1};
        p += n + 1;
    }
    return 0;
}

static int parse_mig(const char *list, struct sim_config *cfg, char *err, size_t errlen)
{
    if (!list || !*list)
        return 0;
    const char *p = list;
    for (unsigned i = 0; p; i++) {
        const char *semi = strchr(p, ';');
        size_t len = semi ? (size_t)(semi - p) : strlen(p);
        if (i >= cfg->ndev) {
            if (len == 0 && !semi)
                return 0; /* a trailing ';' */
            snprintf(err, errlen, "VCUDA_SIM_MIG=%s: more entries than the %u devices", list,
                     cfg->ndev);
            return -1;
        }
        if (parse_mig_entry(p, len, i, cfg, err, errlen) != 0)
            return -1;
        p = semi ? semi + 1 : NULL;
    }
    return 0;
}

int sim_config_from_env(struct sim_config *cfg, char *err, size_t errlen)
{
    uint64_t ndev, max_pending, driver, sms, threads, timeslice_us;
    memset(cfg, 0, sizeof *cfg);
    if (env_u64("VCUDA_SIM_DEVICES", 1, &ndev, err, errlen) ||
        env_u64("VCUDA_SIM_MEMORY", 16ull << 30, &cfg->memory, err, errlen) ||
        env_u64("VCUDA_SIM_CONTEXT_OVERHEAD", 64ull << 20, &cfg->ctx_overhead, err, errlen) ||
        env_u64("VCUDA_SIM_DRIVER_VERSION", 13000, &driver, err, errlen) ||
        env_u64("VCUDA_SIM_MAX_PENDING", 1024, &max_pending, err, errlen) ||
        env_u64("VCUDA_SIM_SMS", 132, &sms, err, errlen) ||
        env_u64("VCUDA_SIM_THREADS_PER_SM", 2048, &threads, err, errlen) ||
        env_u64("VCUDA_SIM_POOL_CHUNK", 32ull << 20, &cfg->pool_chunk, err, errlen) ||
        env_u64("VCUDA_SIM_KERNEL_CODE", 0, &cfg->kernel_code, err, errlen) ||
        env_u64("VCUDA_SIM_TIMESLICE_US", 2000, &timeslice_us, err, errlen))
        return -1;
    if (sms < 1 || sms > 1024 || threads < 32 || threads > 8192) {
        snprintf(err, errlen, "VCUDA_SIM_SMS must be 1..1024 and VCUDA_SIM_THREADS_PER_SM 32..8192");
        return -1;
    }
    if (cfg->pool_chunk < SIM_VMM_GRANULARITY || cfg->pool_chunk % SIM_VMM_GRANULARITY) {
        snprintf(err, errlen, "VCUDA_SIM_POOL_CHUNK must be a nonzero multiple of 2Mi");
        return -1;
    }
    cfg->sms = (uint32_t)sms;
    cfg->threads_per_sm = (uint32_t)threads;
    if (ndev < 1 || ndev > SIM_MAX_DEVICES) {
        snprintf(err, errlen, "VCUDA_SIM_DEVICES must be 1..%d", SIM_MAX_DEVICES);
        return -1;
    }
    if (max_pending < 1 || max_pending > 1u << 20) {
        snprintf(err, errlen, "VCUDA_SIM_MAX_PENDING must be 1..1048576");
        return -1;
    }
    if (timeslice_us < 10 || timeslice_us > 1000000) {
        snprintf(err, errlen, "VCUDA_SIM_TIMESLICE_US must be 10..1000000");
        return -1;
    }
    if (driver > 1000000) {
        snprintf(err, errlen, "VCUDA_SIM_DRIVER_VERSION must look like 13000");
        return -1;
    }
    cfg->ndev = (uint32_t)ndev;
    cfg->max_pending = (uint32_t)max_pending;
    cfg->timeslice_ns = timeslice_us * 1000;
    cfg->driver_version = (int32_t)driver;
    if (parse_numa(getenv("VCUDA_SIM_NUMA"), cfg, err, errlen) ||
        parse_nvlink(getenv("VCUDA_SIM_NVLINK"), cfg, err, errlen) ||
        parse_mig_model(getenv("VCUDA_SIM_MIG_MODEL"), cfg, err, errlen) ||
        parse_mig(getenv("VCUDA_SIM_MIG"), cfg, err, errlen))
        return -1;
    for (unsigned i = 0; i < cfg->ndev; i++) {
        /* Deterministic, real-looking UUIDs: GPU-5157a0c0-0000-4000-8000-00000000000<i>. */
        snprintf(cfg->uuid[i], SIM_STR, "GPU-5157a0c0-%04x-4000-8000-%012x", i, i);
        snprintf(cfg->name[i], SIM_STR, "vcuda simulated GPU");
    }
    split_list(getenv("VCUDA_SIM_UUIDS"), cfg->uuid, cfg->ndev);
    split_list(getenv("VCUDA_SIM_NAMES"), cfg->name, cfg->ndev);
    /* A single name applies to every device. */
    const char *names = getenv("VCUDA_SIM_NAMES");
    cfg->names_set = names && *names;
    if (names && *names && !strchr(names, ','))
        for (unsigned i = 1; i < cfg->ndev; i++)
            memcpy(cfg->name[i], cfg->name[0], SIM_STR);
    return 0;
}

const char *sim_state_path(char *buf, size_t len)
{
    const char *p = getenv("VCUDA_SIM_STATE");
    if (p && *p)
        snprintf(buf, len, "%s", p);
    else
        snprintf(buf, len, "/tmp/vcuda-sim-%u/state", (unsigned)getuid());
    return buf;
}
