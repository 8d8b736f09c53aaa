/* The MIG model: GPU-instance profiles of the simulated GPUs, placements,
 * GPU and compute instances, and the MIG devices they make. Shared by the
 * NVML side (which creates and destroys instances) and the CUDA side (which
 * runs work on MIG devices). Everything lives in the shared state file.
 *
 * A GPU has 8 memory slices and 7 compute slices. A GPU instance occupies
 * the memory slices of its placement [start, start + size) and its profile's
 * compute slices; it fits when its placement is one the profile allows, its
 * memory slices are free, the compute slices in use stay within 7, and the
 * profile's instance count is not reached. Each GPU instance has at most one
 * compute instance, spanning it: that pair is a MIG device. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "sim.h"

/* NVIDIA's MIG user guide ("Supported MIG Profiles"), memory and SMs as
 * `nvidia-smi mig -lgip` reports them. Placement starts, in memory slices:
 * 1 slice {0..6}, 2 slices {0,2,4,6} (1g.20gb) or {0,2,4} (2g), 3g {0,4},
 * 4g {0}, 7g {0}. */
#define P(name, idx, id, g, msl, starts, max, sms, ce, dec, enc, jpg, ofa, mb) \
    {name, idx, id, g, msl, starts, max, sms, ce, dec, enc, jpg, ofa, mb}
static const struct sim_mig_profile h100_80gb[] = {
    /* name         NVML id  g mem starts max  SMs CE DEC ENC JPG OFA  MiB */
    P("1g.10gb",    0, 19, 1, 1, 0x7F, 7,  16, 1, 1, 0, 1, 0, 9984),
    P("1g.10gb+me", 7, 20, 1, 1, 0x7F, 1,  16, 1, 1, 0, 1, 1, 9984),
    P("1g.20gb",    9, 15, 1, 2, 0x55, 4,  26, 1, 1, 0, 1, 0, 20096),
    P("2g.20gb",    1, 14, 2, 2, 0x15, 3,  32, 2, 2, 0, 2, 0, 20096),
    P("3g.40gb",    2,  9, 3, 4, 0x11, 2,  60, 3, 3, 0, 3, 0, 40448),
    P("4g.40gb",    3,  5, 4, 4, 0x01, 1,  64, 4, 4, 0, 4, 0, 40448),
    P("7g.80gb",    4,  0, 7, 8, 0x01, 1, 132, 8, 7, 0, 7, 1, 81152),
};
static const struct sim_mig_profile a100_40gb[] = {
    P("1g.5gb",     0, 19, 1, 1, 0x7F, 7,  14, 1, 0, 0, 0, 0, 4864),
    P("1g.5gb+me",  7, 20, 1, 1, 0x7F, 1,  14, 1, 1, 0, 1, 1, 4864),
    P("1g.10gb",    9, 15, 1, 2, 0x55, 4,  14, 1, 1, 0, 0, 0, 9856),
    P("2g.10gb",    1, 14, 2, 2, 0x15, 3,  28, 2, 1, 0, 0, 0, 9856),
    P("3g.20gb",    2,  9, 3, 4, 0x11, 2,  42, 3, 2, 0, 0, 0, 19968),
    P("4g.20gb",    3,  5, 4, 4, 0x01, 1,  56, 4, 2, 0, 0, 0, 19968),
    P("7g.40gb",    4,  0, 7, 8, 0x01, 1,  98, 7, 5, 0, 1, 1, 40192),
};
#undef P

const struct sim_mig_model sim_mig_models[] = {
    {"h100-80gb", "NVIDIA H100 80GB HBM3", 81559ull << 20, 132,
     sizeof h100_80gb / sizeof h100_80gb[0], h100_80gb},
    {"a100-40gb", "NVIDIA A100-SXM4-40GB", 40960ull << 20, 108,
     sizeof a100_40gb / sizeof a100_40gb[0], a100_40gb},
};
const unsigned sim_mig_nmodels = sizeof sim_mig_models / sizeof sim_mig_models[0];

const struct sim_mig_model *sim_mig_model(const struct sim_shared *sh)
{
    return &sim_mig_models[sh->mig_model < sim_mig_nmodels ? sh->mig_model : 0];
}

int sim_mig_profile_by_name(const struct sim_mig_model *m, const char *name, size_t len)
{
    for (unsigned i = 0; i < m->nprofiles; i++)
        if (strlen(m->profiles[i].name) == len && strncmp(m->profiles[i].name, name, len) == 0)
            return (int)i;
    return -1;
}

/* GPU instance ids follow the placement, as on the hardware: 0 for the
 * whole GPU, 1-2 for halves, 3-6 for quarters, 7-14 for eighths. */
unsigned sim_gi_id(unsigned start, unsigned size)
{
    return SIM_MIG_SLICES / size - 1 + start / size;
}

static bool fits(const struct sim_mig *mig, const struct sim_mig_model *m, unsigned profile,
                 unsigned start)
{
    const struct sim_mig_profile *p = &m->profiles[profile];
    unsigned want = ((1u << p->mem_slices) - 1) << start, busy = 0;
    for (unsigned k = 0; k < SIM_MIG_MAX; k++) {
        const struct sim_gi *g = &mig->gi[k];
        if (g->live)
            busy |= ((1u << g->size) - 1) << g->start;
    }
    return !(busy & want);
}

/* Instance count and compute slices: what any placement needs. */
static bool room(const struct sim_mig *mig, const struct sim_mig_model *m, unsigned profile)
{
    const struct sim_mig_profile *p = &m->profiles[profile];
    unsigned same = 0, gpcs = 0, ofas = 0, slots = 0;
    for (unsigned k = 0; k < SIM_MIG_MAX; k++) {
        const struct sim_gi *g = &mig->gi[k];
        if (!g->live)
            continue;
        slots++;
        same += g->profile == profile;
        gpcs += m->profiles[g->profile].slices;
        ofas += m->profiles[g->profile].ofas;
    }
    return slots < SIM_MIG_MAX && same < p->max_count && gpcs + p->slices <= SIM_MIG_GPCS &&
           ofas + p->ofas <= 1;
}

enum sim_mig_rc sim_gi_place(const struct sim_mig *mig, const struct sim_mig_model *m,
                             unsigned profile, int start, unsigned *out_start)
{
    if (profile >= m->nprofiles)
        return SIM_MIG_INVALID;
    const struct sim_mig_profile *p = &m->profiles[profile];
    if (start >= 0 && (start >= SIM_MIG_SLICES || !(p->starts & (1u << start))))
        return SIM_MIG_INVALID;
    if (!room(mig, m, profile))
        return SIM_MIG_NO_RESOURCES;
    /* Without a placement, the highest free start, as the driver tends to: small
     * instances fill the GPU from the end, leaving the low starts that the
     * large profiles need (4g and 7g only start at 0). */
    for (unsigned s = SIM_MIG_SLICES; s-- > 0;) {
        if (!(p->starts & (1u << s)) || (start >= 0 && s != (unsigned)start))
            continue;
        if (fits(mig, m, profile, s)) {
            *out_start = s;
            return SIM_MIG_OK;
        }
    }
    return SIM_MIG_NO_RESOURCES;
}

unsigned sim_gi_remaining(const struct sim_mig *mig, const struct sim_mig_model *m,
                          unsigned profile)
{
    struct sim_mig scratch = *mig;
    unsigned n = 0, start;
    while (sim_gi_place(&scratch, m, profile, -1, &start) == SIM_MIG_OK) {
        for (unsigned k = 0; k < SIM_MIG_MAX; k++) {
            if (!scratch.gi[k].live) {
                scratch.gi[k] = (struct sim_gi){.live = 1, .profile = profile, .start = start,
                                                .size = m->profiles[profile].mem_slices};
                break;
            }
        }
        n++;
    }
    return n;
}

unsigned sim_phys_parent(unsigned phys)
{
    return phys < SIM_MAX_DEVICES ? phys : (phys - SIM_MAX_DEVICES) / SIM_MIG_MAX;
}

bool sim_phys_valid(const struct sim_shared *sh, unsigned phys)
{
    if (phys < SIM_MAX_DEVICES)
        return phys < sh->ndev;
    if (phys >= SIM_MAX_PHYS)
        return false;
    unsigned d = sim_phys_parent(phys), k = (phys - SIM_MAX_DEVICES) % SIM_MIG_MAX;
    const struct sim_mig *mig = &sh->mig[d];
    return d < sh->ndev && mig->mode && mig->gi[k].live && mig->gi[k].ci_live;
}

bool sim_phys_busy(const struct sim_shared *sh, unsigned phys)
{
    for (uint32_t i = 0; i < sh->nproc_hw; i++) {
        const struct sim_proc *p = &sh->proc[i];
        if (p->pid && (p->contexts[phys] || p->used[phys]))
            return true;
    }
    return false;
}

/* FNV-1a over the parent's UUID and the instance ids, formatted as a UUID:
 * the same instance on the same GPU always gets the same MIG UUID. */
void sim_mig_uuid(const char *parent_uuid, unsigned gi, unsigned ci, char *out, size_t len)
{
    uint64_t h[2];
    for (int round = 0; round < 2; round++) {
        uint64_t x = 1469598103934665603ull ^ (uint64_t)round;
        for (const char *q = parent_uuid; *q; q++)
            x = (x ^ (unsigned char)*q) * 1099511628211ull;
        x = (x ^ gi) * 1099511628211ull;
        x = (x ^ ci) * 1099511628211ull;
        x ^= x >> 33; /* spread the last bytes' changes over the whole UUID */
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        h[round] = x;
    }
    snprintf(out, len, "MIG-%08x-%04x-5%03x-8%03x-%012llx", (unsigned)(h[0] >> 32),
             (unsigned)(h[0] >> 16) & 0xffff, (unsigned)h[0] & 0xfff,
             (unsigned)(h[1] >> 48) & 0xfff, (unsigned long long)(h[1] & 0xffffffffffffull));
}

void sim_mig_device_init(struct sim_shared *sh, unsigned dev, unsigned slot)
{
    const struct sim_gi *g = &sh->mig[dev].gi[slot];
    const struct sim_mig_profile *p = &sim_mig_model(sh)->profiles[g->profile];
    unsigned phys = SIM_MIG_PHYS(dev, slot);
    struct sim_device *d = &sh->dev[phys];
    memset(d, 0, sizeof *d);
    sim_mig_uuid(sh->dev[dev].uuid, g->id, g->ci_id, d->uuid, sizeof d->uuid);
    char parent[64];
    snprintf(parent, sizeof parent, "%s", sh->dev[dev].name);
    snprintf(d->name, sizeof d->name, "%.63s MIG %.16s", parent, p->name);
    d->capacity = p->memory_mb << 20;
    d->sms = p->sms;
    d->numa_node = sh->dev[dev].numa_node;
    d->rr_slot = -1;
    /* A new device: nothing of an earlier instance in this slot carries over. */
    for (uint32_t i = 0; i < sh->nproc_hw; i++) { /* later slots are cleared at attach */
        struct sim_proc *pr = &sh->proc[i];
        pr->used[phys] = pr->queued_ns[phys] = pr->busy_ns[phys] = pr->kernels[phys] = 0;
        pr->contexts[phys] = 0;
        memset(pr->mem[phys], 0, sizeof pr->mem[phys]);
    }
}

static enum sim_mig_rc mig_of(struct sim_shared *sh, unsigned dev, struct sim_mig **out)
{
    if (dev >= sh->ndev || !sh->mig[dev].capable || !sh->mig[dev].mode)
        return SIM_MIG_NOT_SUPPORTED;
    *out = &sh->mig[dev];
    return SIM_MIG_OK;
}

enum sim_mig_rc sim_gi_create(struct sim_shared *sh, unsigned dev, unsigned profile, int start,
                              unsigned *slot)
{
    struct sim_mig *mig;
    unsigned at;
    enum sim_mig_rc rc = mig_of(sh, dev, &mig);
    if (rc == SIM_MIG_OK)
        rc = sim_gi_place(mig, sim_mig_model(sh), profile, start, &at);
    if (rc != SIM_MIG_OK)
        return rc;
    for (unsigned k = 0; k < SIM_MIG_MAX; k++) {
        if (!mig->gi[k].live) {
            unsigned size = sim_mig_model(sh)->profiles[profile].mem_slices;
            mig->gi[k] = (struct sim_gi){.live = 1, .profile = profile, .start = at,
                                         .size = size, .id = sim_gi_id(at, size),
                                         .serial = ++sh->mig_serial};
            *slot = k;
            return SIM_MIG_OK;
        }
    }
    return SIM_MIG_NO_RESOURCES; /* unreachable: room() counts the slots */
}

static enum sim_mig_rc gi_of(struct sim_shared *sh, unsigned dev, unsigned slot,
                             struct sim_gi **out)
{
    struct sim_mig *mig;
    enum sim_mig_rc rc = mig_of(sh, dev, &mig);
    if (rc != SIM_MIG_OK)
        return rc;
    if (slot >= SIM_MIG_MAX || !mig->gi[slot].live)
        return SIM_MIG_INVALID;
    *out = &mig->gi[slot];
    return SIM_MIG_OK;
}

enum sim_mig_rc sim_gi_destroy(struct sim_shared *sh, unsigned dev, unsigned slot)
{
    struct sim_gi *g;
    enum sim_mig_rc rc = gi_of(sh, dev, slot, &g);
    if (rc == SIM_MIG_OK && g->ci_live)
        rc = SIM_MIG_IN_USE; /* as NVML: its compute instances go first */
    if (rc == SIM_MIG_OK)
        g->live = 0;
    return rc;
}

enum sim_mig_rc sim_ci_create(struct sim_shared *sh, unsigned dev, unsigned slot)
{
    struct sim_gi *g;
    enum sim_mig_rc rc = gi_of(sh, dev, slot, &g);
    if (rc == SIM_MIG_OK && g->ci_live)
        rc = SIM_MIG_NO_RESOURCES; /* one compute instance spans the whole GPU instance */
    if (rc != SIM_MIG_OK)
        return rc;
    g->ci_id = 0;
    sim_mig_device_init(sh, dev, slot);
    g->ci_live = 1;
    return SIM_MIG_OK;
}

enum sim_mig_rc sim_ci_destroy(struct sim_shared *sh, unsigned dev, unsigned slot)
{
    struct sim_gi *g;
    enum sim_mig_rc rc = gi_of(sh, dev, slot, &g);
    if (rc == SIM_MIG_OK && !g->ci_live)
        rc = SIM_MIG_INVALID;
    if (rc == SIM_MIG_OK && sim_phys_busy(sh, SIM_MIG_PHYS(dev, slot)))
        rc = SIM_MIG_IN_USE;
    if (rc == SIM_MIG_OK)
        g->ci_live = 0;
    return rc;
}

/* Takes effect at once: the simulator stands for "set, then reset the GPU",
 * which needs the GPU and all its instances idle. */
enum sim_mig_rc sim_mig_set_mode(struct sim_shared *sh, unsigned dev, bool on)
{
    if (dev >= sh->ndev || !sh->mig[dev].capable)
        return SIM_MIG_NOT_SUPPORTED;
    struct sim_mig *mig = &sh->mig[dev];
    if ((bool)mig->mode == on)
        return SIM_MIG_OK;
    if (sim_phys_busy(sh, dev))
        return SIM_MIG_IN_USE;
    for (unsigned k = 0; k < SIM_MIG_MAX; k++)
        if (mig->gi[k].live)
            return SIM_MIG_IN_USE;
    mig->mode = on;
    return SIM_MIG_OK;
}

unsigned sim_mig_devices(const struct sim_shared *sh, unsigned dev, unsigned *phys)
{
    unsigned n = 0;
    if (dev >= sh->ndev || !sh->mig[dev].mode)
        return 0;
    for (unsigned id = 0; id < 2 * SIM_MIG_SLICES - 1; id++)
        for (unsigned k = 0; k < SIM_MIG_MAX; k++) {
            const struct sim_gi *g = &sh->mig[dev].gi[k];
            if (g->live && g->ci_live && g->id == id)
                phys[n++] = SIM_MIG_PHYS(dev, k);
        }
    return n;
}

bool sim_phys_usable(const struct sim_shared *sh, unsigned phys)
{
    return sim_phys_valid(sh, phys) && !(phys < SIM_MAX_DEVICES && sh->mig[phys].mode);
}
