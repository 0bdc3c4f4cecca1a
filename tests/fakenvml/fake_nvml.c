/*
 * A fake libnvidia-ml.so.1 for podguard's test suite.
 *
 * Why: the machines the tests run on have no GPU and no NVIDIA driver, yet podguard's NVML code must be
 * exercised through the real `nvidia-ml-py` binding (ctypes, lazy symbol lookup, versioned symbols and
 * struct layouts). This library is compiled from NVML's REAL header (from the `nvidia-nvml-dev` wheel), so
 * every exported function has exactly the signature the driver's library has; the compiler checks it.
 *
 * Behaviour comes from a line-based scenario file (env FAKE_NVML_SCENARIO; written by
 * tests/fakenvml/scenario.py). It is re-read on every nvmlInit* and whenever its identity (inode, size,
 * mtime) changes, so a test can change the node while a process runs.
 *
 * GPU processes are REAL processes: besides static entries in the scenario (which may be host PIDs that
 * do not exist here), stand-in GPU processes register themselves in a registry directory
 * (env FAKE_NVML_PROCS_DIR, default `procs/` next to the scenario) with a file named after their PID. An
 * entry counts only while its PID is alive (not a zombie, same start time), so memory comes back when the
 * holder dies, like the driver. `release_delay_ms` keeps a dead holder's memory counted a little longer.
 *
 * MIG: a process may run on one MIG slot of a GPU (`mig=<slot>` in the registry, a 5th field of `proc=`).
 * A MIG device handle lists only its slot's processes and reports its slot's memory; the parent handle
 * lists every slot's processes. `gpu.<i>.fail=mig.<field>,<ERROR>` fails a query on the GPU's MIG handles
 * only, `fail=<field>,...` on the parent only (an unprivileged container's view: the parent answers
 * NO_PERMISSION, its MIG devices answer).
 *
 * XID events (nvmlEventSetWait*): each scenario `xid=` line is delivered once per process, after_ms after the
 * later of the set's creation and the moment this process first read the line (see event_wait), so a long-lived
 * set polled with a 0 ms timeout gets XIDs a test writes while it runs; `event_wait_error=` breaks the wait.
 *
 * Extra (non-NVML) symbols for tests: fakeNvmlInitCount(), fakeNvmlCallCount(), fakeNvmlResetCallCount().
 * Compile with -DFAKE_OLD_DRIVER to leave out symbols an old driver lacks (tests FunctionNotFound).
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* we define both the unversioned and the versioned entry points */

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#pragma GCC visibility push(default)
#include <nvml.h>
#pragma GCC visibility pop

#define MAX_GPUS 64
#define MAX_MIG 7 /* H100/A100: up to 7 MIG devices */
#define MAX_STATIC_PROCS 256
#define MAX_REG_PROCS 512
#define MAX_ALSO 8
#define MAX_XIDS 64
#define MAX_FAILS 48
#define MAX_DEAD 512
#define MIB (1024ULL * 1024ULL)
#define NA_ID 0xFFFFFFFFu

/* ------------------------------------------------------------------------------------------------ */
/* State                                                                                              */
/* ------------------------------------------------------------------------------------------------ */

typedef struct {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    unsigned int gi, ci;
    unsigned long long mem_total; /* 0: the GPU's total divided by its MIG devices */
} mig_t;

typedef struct {
    char field[32];
    nvmlReturn_t err;
} fail_t;

typedef struct {
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned int pci_device_id, pci_subsys_id;
    unsigned int minor;
    unsigned long long mem_total, mem_reserved, mem_used, phantom;
    unsigned int util_gpu, util_mem;
    unsigned int compute_mode, persistence;
    unsigned int mig_current, mig_pending, n_mig;
    mig_t mig[MAX_MIG];
    unsigned int ecc_current, ecc_pending;
    unsigned long long ecc_unc_vol, ecc_corr_vol, ecc_unc_agg, ecc_corr_agg;
    unsigned int retired_pending;
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    unsigned long long clock_events;
    unsigned long long clock_events_first; /* what the first clock_events_reads reads answer (a transient bit) */
    unsigned int clock_events_reads, clock_events_done;
    unsigned int temp, temp_slowdown, temp_shutdown;
    unsigned int power_mw; /* nvmlDeviceGetPowerUsage: milliwatts */
    unsigned int pcie_width, pcie_width_max;
    unsigned int pcie_gen, pcie_gen_max;
    unsigned int nvlink_links;     /* links the GPU has; 0: no NVLink (NOT_SUPPORTED) */
    unsigned long long nvlink_down; /* bit i set: link i is inactive */
    unsigned int recovery_action;
    int lost;
    int n_fail;
    fail_t fail[MAX_FAILS];
} gpu_t;

typedef struct {
    unsigned int pid, gpu;
    unsigned long long mem;
    int graphics;
    int mig; /* MIG slot it runs on; -1: none */
} sproc_t;

typedef struct {
    unsigned int gpu, code, after_ms;
} xid_t;

typedef struct {
    int gpu_count;
    nvmlReturn_t init_error;
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda_version;
    unsigned int release_delay_ms;
    char procs_dir[1024];
    gpu_t gpu[MAX_GPUS];
    int n_sproc;
    sproc_t sproc[MAX_STATIC_PROCS];
    int n_xid;
    xid_t xid[MAX_XIDS];
    nvmlReturn_t event_wait_error; /* what nvmlEventSetWait* answers instead of waiting (0: wait) */
    int event_wait_hang;           /* nvmlEventSetWait* never returns while this is set (a GPU that stopped answering) */
} scenario_t;

/* A registered (real, local) GPU process, read from the registry directory. */
typedef struct {
    unsigned int pid, gpu;
    unsigned long long mem, start;
    int graphics;
    int mig; /* MIG slot; -1: none */
    int n_also;
    unsigned int also[MAX_ALSO];
} rproc_t;

/* When this process first saw a registered holder dead: drives release_delay_ms. */
typedef struct {
    unsigned int pid;
    unsigned long long start;
    double t;
} dead_t;

struct nvmlDevice_st {
    int gpu;
    int mig; /* -1: the full GPU; else the MIG slot */
};

struct nvmlEventSet_st {
    unsigned long long mask[MAX_GPUS];
    double created;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static scenario_t g_sc;
static int g_loaded;          /* a scenario has been parsed */
static char g_sc_path[1024];  /* path it was read from */
static struct stat g_sc_stat; /* identity of what was read */
static int g_init_count;
static unsigned long long g_calls;
static int g_xid_delivered[MAX_XIDS];
static double g_xid_seen[MAX_XIDS]; /* when this process first read the scenario line of each XID */
static struct nvmlDevice_st g_dev[MAX_GPUS];
static struct nvmlDevice_st g_mig_dev[MAX_GPUS][MAX_MIG];
static dead_t g_dead[MAX_DEAD];
static int g_n_dead;

static double now_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------------------------------------ */
/* Scenario parsing                                                                                  */
/* ------------------------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    nvmlReturn_t code;
} k_errors[] = {
    {"SUCCESS", NVML_SUCCESS},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
    {"ALREADY_INITIALIZED", NVML_ERROR_ALREADY_INITIALIZED},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE},
    {"INSUFFICIENT_POWER", NVML_ERROR_INSUFFICIENT_POWER},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED},
    {"TIMEOUT", NVML_ERROR_TIMEOUT},
    {"IRQ_ISSUE", NVML_ERROR_IRQ_ISSUE},
    {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND},
    {"CORRUPTED_INFOROM", NVML_ERROR_CORRUPTED_INFOROM},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED},
    {"OPERATING_SYSTEM", NVML_ERROR_OPERATING_SYSTEM},
    {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH},
    {"IN_USE", NVML_ERROR_IN_USE},
    {"MEMORY", NVML_ERROR_MEMORY},
    {"NO_DATA", NVML_ERROR_NO_DATA},
    {"INSUFFICIENT_RESOURCES", NVML_ERROR_INSUFFICIENT_RESOURCES},
    {"ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH},
    {"DEPRECATED", NVML_ERROR_DEPRECATED},
    {"NOT_READY", NVML_ERROR_NOT_READY},
    {"GPU_NOT_FOUND", NVML_ERROR_GPU_NOT_FOUND},
    {"INVALID_STATE", NVML_ERROR_INVALID_STATE},
    {"UNKNOWN", NVML_ERROR_UNKNOWN},
};

static nvmlReturn_t parse_error(const char *s) {
    if (strncmp(s, "NVML_ERROR_", 11) == 0) s += 11;
    if (strncmp(s, "NVML_", 5) == 0) s += 5;
    for (size_t i = 0; i < sizeof(k_errors) / sizeof(k_errors[0]); i++)
        if (strcmp(s, k_errors[i].name) == 0) return k_errors[i].code;
    if (isdigit((unsigned char)*s)) return (nvmlReturn_t)strtol(s, NULL, 10);
    fprintf(stderr, "fake NVML: unknown error name '%s' in scenario, using UNKNOWN\n", s);
    return NVML_ERROR_UNKNOWN;
}

static unsigned long long num(const char *s) { return strtoull(s, NULL, 0); }

/* Copy with truncation (scenario values are short; never overflow). */
static void copy_str(char *dst, size_t n, const char *src) {
    size_t len = strlen(src);
    if (len >= n) len = n - 1;
    memcpy(dst, src, len);
    dst[len] = 0;
}

static void gpu_defaults(gpu_t *g, int i) {
    memset(g, 0, sizeof(*g));
    copy_str(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
    snprintf(g->uuid, sizeof g->uuid, "GPU-00000000-0000-0000-0000-%012d", i);
    snprintf(g->pci_bus_id, sizeof g->pci_bus_id, "00000000:%02X:00.0", 0x18 + i);
    g->pci_device_id = 0x233010DE;
    g->pci_subsys_id = 0x16C110DE;
    g->minor = (unsigned int)i;
    g->mem_total = 81559ULL * MIB;
    g->mem_reserved = 530ULL * MIB;
    g->compute_mode = NVML_COMPUTEMODE_DEFAULT;
    g->persistence = 1;
    g->ecc_current = g->ecc_pending = 1;
    g->clock_events = 0x1; /* idle */
    g->temp = 33;
    g->temp_slowdown = 87;
    g->temp_shutdown = 92;
    g->power_mw = 70000; /* an idle H100 SXM draws ~70 W */
    g->pcie_width = g->pcie_width_max = 16;
    g->pcie_gen = g->pcie_gen_max = 5;
    g->nvlink_links = 18; /* H100 SXM: 18 NVLink 4 links */
}

static void add_fail(gpu_t *g, const char *field, nvmlReturn_t err) {
    for (int i = 0; i < g->n_fail; i++)
        if (strcmp(g->fail[i].field, field) == 0) {
            g->fail[i].err = err;
            return;
        }
    if (g->n_fail >= MAX_FAILS) return;
    copy_str(g->fail[g->n_fail].field, sizeof g->fail[0].field, field);
    g->fail[g->n_fail].err = err;
    g->n_fail++;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

static unsigned int parse_compute_mode(const char *v) {
    if (strcmp(v, "DEFAULT") == 0) return NVML_COMPUTEMODE_DEFAULT;
    if (strcmp(v, "EXCLUSIVE_THREAD") == 0) return NVML_COMPUTEMODE_EXCLUSIVE_THREAD;
    if (strcmp(v, "PROHIBITED") == 0) return NVML_COMPUTEMODE_PROHIBITED;
    if (strcmp(v, "EXCLUSIVE_PROCESS") == 0) return NVML_COMPUTEMODE_EXCLUSIVE_PROCESS;
    return (unsigned int)num(v);
}

static void set_gpu_key(gpu_t *g, const char *k, const char *v) {
    if (!strcmp(k, "name")) copy_str(g->name, sizeof g->name, v);
    else if (!strcmp(k, "uuid")) copy_str(g->uuid, sizeof g->uuid, v);
    else if (!strcmp(k, "pci_bus_id")) copy_str(g->pci_bus_id, sizeof g->pci_bus_id, v);
    else if (!strcmp(k, "pci_device_id")) g->pci_device_id = (unsigned int)num(v);
    else if (!strcmp(k, "pci_subsys_id")) g->pci_subsys_id = (unsigned int)num(v);
    else if (!strcmp(k, "minor")) g->minor = (unsigned int)num(v);
    else if (!strcmp(k, "mem_total_mib")) g->mem_total = num(v) * MIB;
    else if (!strcmp(k, "mem_reserved_mib")) g->mem_reserved = num(v) * MIB;
    else if (!strcmp(k, "mem_used_mib")) g->mem_used = num(v) * MIB;
    else if (!strcmp(k, "phantom_mib")) g->phantom = num(v) * MIB;
    else if (!strcmp(k, "util_gpu")) g->util_gpu = (unsigned int)num(v);
    else if (!strcmp(k, "util_mem")) g->util_mem = (unsigned int)num(v);
    else if (!strcmp(k, "compute_mode")) g->compute_mode = parse_compute_mode(v);
    else if (!strcmp(k, "persistence")) g->persistence = (unsigned int)num(v);
    else if (!strcmp(k, "mig")) g->mig_current = (unsigned int)num(v);
    else if (!strcmp(k, "mig_pending")) g->mig_pending = (unsigned int)num(v);
    else if (!strcmp(k, "mig_device")) {
        /* MIG-<uuid>,<gpu instance id>,<compute instance id>[,<memory total MiB>] */
        if (g->n_mig >= MAX_MIG) return;
        mig_t *m = &g->mig[g->n_mig];
        char buf[256];
        copy_str(buf, sizeof buf, v);
        char *save = NULL, *tok = strtok_r(buf, ",", &save);
        copy_str(m->uuid, sizeof m->uuid, tok ? trim(tok) : "");
        tok = strtok_r(NULL, ",", &save);
        m->gi = tok ? (unsigned int)num(tok) : 0;
        tok = strtok_r(NULL, ",", &save);
        m->ci = tok ? (unsigned int)num(tok) : 0;
        tok = strtok_r(NULL, ",", &save);
        m->mem_total = tok ? num(tok) * MIB : 0;
        g->n_mig++;
    } else if (!strcmp(k, "ecc")) g->ecc_current = g->ecc_pending = (unsigned int)num(v);
    else if (!strcmp(k, "ecc_pending")) g->ecc_pending = (unsigned int)num(v);
    else if (!strcmp(k, "ecc_unc_volatile")) g->ecc_unc_vol = num(v);
    else if (!strcmp(k, "ecc_corr_volatile")) g->ecc_corr_vol = num(v);
    else if (!strcmp(k, "ecc_unc_aggregate")) g->ecc_unc_agg = num(v);
    else if (!strcmp(k, "ecc_corr_aggregate")) g->ecc_corr_agg = num(v);
    else if (!strcmp(k, "retired_pending")) g->retired_pending = (unsigned int)num(v);
    else if (!strcmp(k, "remap_corr")) g->remap_corr = (unsigned int)num(v);
    else if (!strcmp(k, "remap_unc")) g->remap_unc = (unsigned int)num(v);
    else if (!strcmp(k, "remap_pending")) g->remap_pending = (unsigned int)num(v);
    else if (!strcmp(k, "remap_failure")) g->remap_failure = (unsigned int)num(v);
    else if (!strcmp(k, "clock_events")) g->clock_events = num(v);
    else if (!strcmp(k, "clock_events_first")) g->clock_events_first = num(v);
    else if (!strcmp(k, "clock_events_reads")) g->clock_events_reads = (unsigned int)num(v);
    else if (!strcmp(k, "temp")) g->temp = (unsigned int)num(v);
    else if (!strcmp(k, "temp_slowdown")) g->temp_slowdown = (unsigned int)num(v);
    else if (!strcmp(k, "temp_shutdown")) g->temp_shutdown = (unsigned int)num(v);
    else if (!strcmp(k, "power_mw")) g->power_mw = (unsigned int)num(v);
    else if (!strcmp(k, "pcie_width")) g->pcie_width = (unsigned int)num(v);
    else if (!strcmp(k, "pcie_width_max")) g->pcie_width_max = (unsigned int)num(v);
    else if (!strcmp(k, "pcie_gen")) g->pcie_gen = (unsigned int)num(v);
    else if (!strcmp(k, "pcie_gen_max")) g->pcie_gen_max = (unsigned int)num(v);
    else if (!strcmp(k, "nvlink_links")) g->nvlink_links = (unsigned int)num(v);
    else if (!strcmp(k, "nvlink_down")) g->nvlink_down = num(v);
    else if (!strcmp(k, "recovery_action")) g->recovery_action = (unsigned int)num(v);
    else if (!strcmp(k, "lost")) g->lost = (int)num(v);
    else if (!strcmp(k, "unsupported")) {
        /* comma-separated field names, each answering NOT_SUPPORTED */
        char buf[1024];
        copy_str(buf, sizeof buf, v);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (*trim(tok)) add_fail(g, trim(tok), NVML_ERROR_NOT_SUPPORTED);
    } else if (!strcmp(k, "fail")) {
        /* <field>,<ERROR_NAME> */
        char buf[256];
        copy_str(buf, sizeof buf, v);
        char *comma = strchr(buf, ',');
        if (!comma) return;
        *comma = 0;
        add_fail(g, trim(buf), parse_error(trim(comma + 1)));
    } else fprintf(stderr, "fake NVML: unknown gpu key '%s'\n", k);
}

static void parse_line(scenario_t *sc, char *line) {
    char *eq = strchr(line, '=');
    if (!eq) return;
    *eq = 0;
    char *k = trim(line), *v = trim(eq + 1);
    if (!strncmp(k, "gpu.", 4)) {
        char *dot = NULL;
        long idx = strtol(k + 4, &dot, 10);
        if (!dot || *dot != '.' || idx < 0 || idx >= MAX_GPUS) return;
        set_gpu_key(&sc->gpu[idx], dot + 1, v);
    } else if (!strcmp(k, "gpu_count")) {
        long n = strtol(v, NULL, 10);
        sc->gpu_count = n < 0 ? 0 : (n > MAX_GPUS ? MAX_GPUS : (int)n);
    } else if (!strcmp(k, "init_error")) sc->init_error = parse_error(v);
    else if (!strcmp(k, "driver_version")) copy_str(sc->driver_version, sizeof sc->driver_version, v);
    else if (!strcmp(k, "nvml_version")) copy_str(sc->nvml_version, sizeof sc->nvml_version, v);
    else if (!strcmp(k, "cuda_version")) sc->cuda_version = (int)num(v);
    else if (!strcmp(k, "release_delay_ms")) sc->release_delay_ms = (unsigned int)num(v);
    else if (!strcmp(k, "procs_dir")) copy_str(sc->procs_dir, sizeof sc->procs_dir, v);
    else if (!strcmp(k, "proc")) {
        /* <pid>,<gpu>,<mem_mib>[,compute|graphics[,<mig slot>]] */
        if (sc->n_sproc >= MAX_STATIC_PROCS) return;
        sproc_t *p = &sc->sproc[sc->n_sproc];
        char kind[32] = "compute";
        unsigned long long mem = 0;
        int mig = -1;
        int n = sscanf(v, "%u , %u , %llu , %31[a-z] , %d", &p->pid, &p->gpu, &mem, kind, &mig);
        if (n < 3) return;
        p->mem = mem * MIB;
        p->graphics = strcmp(kind, "graphics") == 0;
        p->mig = mig;
        sc->n_sproc++;
    } else if (!strcmp(k, "xid")) {
        /* <gpu>,<xid>[,<after_ms>] */
        if (sc->n_xid >= MAX_XIDS) return;
        xid_t *x = &sc->xid[sc->n_xid];
        x->after_ms = 0;
        if (sscanf(v, "%u , %u , %u", &x->gpu, &x->code, &x->after_ms) >= 2) sc->n_xid++;
    } else if (!strcmp(k, "event_wait_error")) sc->event_wait_error = parse_error(v);
    else if (!strcmp(k, "event_wait_hang")) sc->event_wait_hang = atoi(v);
    else if (!strcmp(k, "version")) { /* format version, informative */
    } else fprintf(stderr, "fake NVML: unknown scenario key '%s'\n", k);
}

static int parse_file(const char *path, scenario_t *sc) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(sc, 0, sizeof(*sc));
    for (int i = 0; i < MAX_GPUS; i++) gpu_defaults(&sc->gpu[i], i);
    copy_str(sc->driver_version, sizeof sc->driver_version, "550.54.15");
    copy_str(sc->nvml_version, sizeof sc->nvml_version, "12.550.54.15");
    sc->cuda_version = 12040;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        char *s = trim(line);
        if (*s == 0 || *s == '#') continue;
        parse_line(sc, s);
    }
    fclose(f);
    return 0;
}

/* The XIDs of a newly read scenario: an XID line that a rewrite of the same file kept (same GPU, code and
 * delay) is the same event and keeps its state (delivered, when first seen); any other line is a new event,
 * first seen now. Called with g_lock held, before `fresh` replaces g_sc. */
static void carry_xids(const scenario_t *fresh, int same_path) {
    int delivered[MAX_XIDS] = {0}, taken[MAX_XIDS] = {0};
    double seen[MAX_XIDS] = {0}, now = now_mono();
    for (int i = 0; i < fresh->n_xid; i++) {
        const xid_t *x = &fresh->xid[i];
        seen[i] = now;
        for (int j = 0; same_path && j < g_sc.n_xid; j++) {
            const xid_t *o = &g_sc.xid[j];
            if (taken[j] || o->gpu != x->gpu || o->code != x->code || o->after_ms != x->after_ms) continue;
            taken[j] = 1;
            delivered[i] = g_xid_delivered[j];
            seen[i] = g_xid_seen[j];
            break;
        }
    }
    memcpy(g_xid_delivered, delivered, sizeof g_xid_delivered);
    memcpy(g_xid_seen, seen, sizeof seen);
}

/* Re-read the scenario when forced (nvmlInit*) or when the file changed. Called with g_lock held.
 * A file that cannot be read after a successful load keeps the last state (tmp dirs get cleaned up). */
static int reload(int force) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path || !*path) return g_loaded ? 0 : -1;
    struct stat st;
    if (stat(path, &st) != 0) return g_loaded ? 0 : -1;
    int same_file = g_loaded && strcmp(path, g_sc_path) == 0 && st.st_ino == g_sc_stat.st_ino &&
                    st.st_dev == g_sc_stat.st_dev && st.st_size == g_sc_stat.st_size &&
                    st.st_mtim.tv_sec == g_sc_stat.st_mtim.tv_sec &&
                    st.st_mtim.tv_nsec == g_sc_stat.st_mtim.tv_nsec;
    if (same_file && !force) return 0;
    static scenario_t fresh; /* large: keep it off the stack */
    if (parse_file(path, &fresh) != 0) return g_loaded ? 0 : -1;
    if (!same_file) {
        /* a new scenario: holders seen dead under the old one are forgotten; its XIDs are fresh, except
         * those a rewrite of the same file kept (the same event: delivered at most once) */
        carry_xids(&fresh, g_loaded && strcmp(path, g_sc_path) == 0);
        g_n_dead = 0;
    }
    g_sc = fresh;
    copy_str(g_sc_path, sizeof g_sc_path, path);
    g_sc_stat = st;
    g_loaded = 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Real processes: the registry directory                                                            */
/* ------------------------------------------------------------------------------------------------ */

/* Alive = /proc/<pid>/stat exists, the state is not zombie/dead, and (when known) the start time
 * matches, so a recycled PID does not resurrect an old holder. */
static int pid_alive(unsigned int pid, unsigned long long start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] == 0) return 0;
    p += 2; /* field 3: state */
    if (*p == 'Z' || *p == 'X' || *p == 'x') return 0;
    if (start == 0) return 1;
    /* field 22: starttime; we are at field 3 */
    char *save = NULL, *tok = strtok_r(p, " ", &save);
    for (int field = 3; tok && field < 22; field++) tok = strtok_r(NULL, " ", &save);
    return tok && strtoull(tok, NULL, 10) == start;
}

static void procs_dir_path(char *out, size_t n) {
    const char *env = getenv("FAKE_NVML_PROCS_DIR");
    if (env && *env) {
        copy_str(out, n, env);
    } else if (g_sc.procs_dir[0]) {
        copy_str(out, n, g_sc.procs_dir);
    } else {
        copy_str(out, n - 8, g_sc_path);
        char *slash = strrchr(out, '/');
        if (slash) memcpy(slash, "/procs", 7);
        else copy_str(out, n, "procs");
    }
}

/* One registry file: one line per GPU context:
 *   gpu=<index> mem_mib=<n> [kind=compute|graphics] [mig=<slot>] [start=<starttime>] [also=<pid>,<pid>]  */
static int read_registry(rproc_t *out, int max) {
    char dir[1024];
    procs_dir_path(dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < max) {
        const char *nm = de->d_name;
        if (!isdigit((unsigned char)nm[0])) continue; /* skip dot files and temporary files */
        int digits = 1;
        for (const char *c = nm; *c; c++) digits &= isdigit((unsigned char)*c) != 0;
        if (!digits) continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, nm);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char line[512];
        while (fgets(line, sizeof line, f) && n < max) {
            rproc_t r;
            memset(&r, 0, sizeof r);
            r.mig = -1;
            r.pid = (unsigned int)strtoul(nm, NULL, 10);
            int have_gpu = 0;
            char *save = NULL;
            for (char *tok = strtok_r(line, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
                char *eq = strchr(tok, '=');
                if (!eq) continue;
                *eq = 0;
                const char *k = tok, *v = eq + 1;
                if (!strcmp(k, "gpu")) {
                    r.gpu = (unsigned int)num(v);
                    have_gpu = 1;
                } else if (!strcmp(k, "mem_mib")) r.mem = num(v) * MIB;
                else if (!strcmp(k, "kind")) r.graphics = strcmp(v, "graphics") == 0;
                else if (!strcmp(k, "mig")) r.mig = (int)num(v);
                else if (!strcmp(k, "start")) r.start = num(v);
                else if (!strcmp(k, "also")) {
                    char buf[256];
                    copy_str(buf, sizeof buf, v);
                    char *s2 = NULL;
                    for (char *t = strtok_r(buf, ",", &s2); t && r.n_also < MAX_ALSO; t = strtok_r(NULL, ",", &s2))
                        r.also[r.n_also++] = (unsigned int)num(t);
                }
            }
            if (have_gpu) out[n++] = r;
        }
        fclose(f);
    }
    closedir(d);
    return n;
}

/* Seconds since this process first saw (pid, start) dead; records it now when unseen. */
static double dead_for(unsigned int pid, unsigned long long start, double now) {
    for (int i = 0; i < g_n_dead; i++)
        if (g_dead[i].pid == pid && g_dead[i].start == start) return now - g_dead[i].t;
    if (g_n_dead < MAX_DEAD) g_dead[g_n_dead++] = (dead_t){pid, start, now};
    return 0.0;
}

typedef struct {
    unsigned int pid;
    unsigned long long mem;
    int graphics;
    int mig;
} listed_t;

/* The device's view of processes: what is listed, and how much memory holders use in total. `mig` < 0 is
 * the whole GPU (every MIG device's processes, as a privileged parent query answers); else one MIG slot. */
static int gather(int gpu, int mig, listed_t *list, int max, unsigned long long *mem_sum) {
    static rproc_t reg[MAX_REG_PROCS];
    int n = 0;
    unsigned long long sum = 0;
    for (int i = 0; i < g_sc.n_sproc; i++) {
        const sproc_t *p = &g_sc.sproc[i];
        if ((int)p->gpu != gpu || (mig >= 0 && p->mig != mig)) continue;
        sum += p->mem;
        if (list && n < max) list[n] = (listed_t){p->pid, p->mem, p->graphics, p->mig};
        n++;
    }
    int nr = read_registry(reg, MAX_REG_PROCS);
    double now = now_mono();
    for (int i = 0; i < nr; i++) {
        const rproc_t *r = &reg[i];
        if ((int)r->gpu != gpu || (mig >= 0 && r->mig != mig)) continue;
        int owner = pid_alive(r->pid, r->start);
        int held = owner;
        for (int j = 0; !held && j < r->n_also; j++) held = pid_alive(r->also[j], 0);
        if (!held && g_sc.release_delay_ms > 0)
            held = dead_for(r->pid, r->start, now) * 1000.0 < (double)g_sc.release_delay_ms;
        if (held) sum += r->mem;
        if (owner) {
            if (list && n < max) list[n] = (listed_t){r->pid, r->mem, r->graphics, r->mig};
            n++;
        }
    }
    if (mem_sum) *mem_sum = sum;
    return n;
}

static unsigned long long used_bytes(int gpu) {
    const gpu_t *g = &g_sc.gpu[gpu];
    unsigned long long procs = 0;
    gather(gpu, -1, NULL, 0, &procs);
    unsigned long long used = g->mem_used + g->phantom + procs;
    unsigned long long cap = g->mem_total > g->mem_reserved ? g->mem_total - g->mem_reserved : 0;
    return used > cap ? cap : used;
}

/* ------------------------------------------------------------------------------------------------ */
/* Entry/exit and device resolution                                                                  */
/* ------------------------------------------------------------------------------------------------ */

#define API_BEGIN()                                                                                \
    pthread_mutex_lock(&g_lock);                                                                   \
    g_calls++;                                                                                     \
    reload(0)
#define API_RETURN(r)                                                                              \
    do {                                                                                           \
        nvmlReturn_t _ret = (r);                                                                   \
        pthread_mutex_unlock(&g_lock);                                                             \
        return _ret;                                                                               \
    } while (0)
#define REQUIRE_INIT()                                                                             \
    do {                                                                                           \
        if (g_init_count <= 0) API_RETURN(NVML_ERROR_UNINITIALIZED);                               \
    } while (0)

/* Fields a lost GPU still answers from the driver's cached data. */
static int survives_loss(const char *field) { return !strcmp(field, "pci") || !strcmp(field, "index"); }

/* Resolve a handle and apply the per-GPU switches for `field`: lost GPU, NOT_SUPPORTED, any error. */
static nvmlReturn_t device_check(nvmlDevice_t dev, const char *field, int allow_mig, gpu_t **out) {
    if (!dev) return NVML_ERROR_INVALID_ARGUMENT;
    int idx = -1, mig = -1;
    if (dev >= &g_dev[0] && dev < &g_dev[MAX_GPUS]) {
        idx = (int)(dev - &g_dev[0]);
    } else if (dev >= &g_mig_dev[0][0] && dev < &g_mig_dev[0][0] + MAX_GPUS * MAX_MIG) {
        idx = dev->gpu;
        mig = dev->mig;
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (idx >= g_sc.gpu_count) return NVML_ERROR_GPU_IS_LOST; /* the scenario shrank under us */
    if (mig >= 0 && !allow_mig) return NVML_ERROR_NOT_SUPPORTED;
    gpu_t *g = &g_sc.gpu[idx];
    if (g->lost && !survives_loss(field)) return NVML_ERROR_GPU_IS_LOST;
    /* a MIG handle answers the "mig.<field>" switches; the parent answers the plain ones */
    char key[48];
    snprintf(key, sizeof key, "%s%s", mig >= 0 ? "mig." : "", field);
    for (int i = 0; i < g->n_fail; i++)
        if (!strcmp(g->fail[i].field, key)) return g->fail[i].err;
    if (out) *out = g;
    return NVML_SUCCESS;
}

#define DEVICE(dev, field, allow_mig, gvar)                                                       \
    gpu_t *gvar = NULL;                                                                            \
    do {                                                                                           \
        REQUIRE_INIT();                                                                            \
        nvmlReturn_t _c = device_check((dev), (field), (allow_mig), &gvar);                        \
        if (_c != NVML_SUCCESS) API_RETURN(_c);                                                    \
    } while (0)

static nvmlReturn_t put_str(char *buf, unsigned int len, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Test-only symbols                                                                                  */
/* ------------------------------------------------------------------------------------------------ */

__attribute__((visibility("default"))) int fakeNvmlInitCount(void) {
    pthread_mutex_lock(&g_lock);
    int n = g_init_count;
    pthread_mutex_unlock(&g_lock);
    return n;
}

__attribute__((visibility("default"))) unsigned long long fakeNvmlCallCount(void) {
    pthread_mutex_lock(&g_lock);
    unsigned long long n = g_calls;
    pthread_mutex_unlock(&g_lock);
    return n;
}

__attribute__((visibility("default"))) void fakeNvmlResetCallCount(void) {
    pthread_mutex_lock(&g_lock);
    g_calls = 0;
    pthread_mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------------------------------------------ */
/* Init / shutdown / errors                                                                          */
/* ------------------------------------------------------------------------------------------------ */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_lock);
    g_calls++;
    if (reload(1) != 0) {
        const char *p = getenv("FAKE_NVML_SCENARIO");
        fprintf(stderr, "fake NVML: cannot read scenario file (FAKE_NVML_SCENARIO=%s)\n", p ? p : "<unset>");
        API_RETURN(NVML_ERROR_UNKNOWN);
    }
    if (g_sc.init_error != NVML_SUCCESS) API_RETURN(g_sc.init_error);
    for (int i = 0; i < MAX_GPUS; i++) {
        g_dev[i] = (struct nvmlDevice_st){i, -1};
        for (int m = 0; m < MAX_MIG; m++) g_mig_dev[i][m] = (struct nvmlDevice_st){i, m};
    }
    g_init_count++;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlInit(void) { return do_init(); }
nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    g_calls++;
    if (g_init_count <= 0) API_RETURN(NVML_ERROR_UNINITIALIZED);
    g_init_count--;
    API_RETURN(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* System queries                                                                                     */
/* ------------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    API_BEGIN();
    REQUIRE_INIT();
    API_RETURN(put_str(version, length, g_sc.driver_version));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    API_BEGIN();
    REQUIRE_INIT();
    API_RETURN(put_str(version, length, g_sc.nvml_version));
}

static nvmlReturn_t cuda_version(int *v) {
    API_BEGIN();
    REQUIRE_INIT();
    if (!v) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *v = g_sc.cuda_version;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) { return cuda_version(cudaDriverVersion); }
#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) { return cuda_version(cudaDriverVersion); }
#endif

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    API_BEGIN();
    REQUIRE_INIT();
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f) API_RETURN(NVML_ERROR_NOT_FOUND);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    API_RETURN(put_str(name, length, trim(buf)));
}

/* ------------------------------------------------------------------------------------------------ */
/* Device enumeration                                                                                 */
/* ------------------------------------------------------------------------------------------------ */

static nvmlReturn_t device_count(unsigned int *count) {
    API_BEGIN();
    REQUIRE_INIT();
    if (!count) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)g_sc.gpu_count;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return device_count(deviceCount); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return device_count(deviceCount); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    API_BEGIN();
    REQUIRE_INIT();
    if (!device || index >= (unsigned int)g_sc.gpu_count) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t c = device_check(&g_dev[index], "handle", 0, NULL);
    if (c != NVML_SUCCESS) API_RETURN(c);
    *device = &g_dev[index];
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    API_BEGIN();
    REQUIRE_INIT();
    if (!uuid || !device) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < g_sc.gpu_count; i++) {
        if (!strcmp(g_sc.gpu[i].uuid, uuid)) {
            *device = &g_dev[i];
            API_RETURN(NVML_SUCCESS);
        }
        for (unsigned int m = 0; m < g_sc.gpu[i].n_mig && g_sc.gpu[i].mig_current; m++)
            if (!strcmp(g_sc.gpu[i].mig[m].uuid, uuid)) {
                *device = &g_mig_dev[i][m];
                API_RETURN(NVML_SUCCESS);
            }
    }
    API_RETURN(NVML_ERROR_NOT_FOUND);
}

static nvmlReturn_t handle_by_pci(const char *bus_id, nvmlDevice_t *device) {
    API_BEGIN();
    REQUIRE_INIT();
    if (!bus_id || !device) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < g_sc.gpu_count; i++) {
        const char *mine = g_sc.gpu[i].pci_bus_id;
        /* accept the short domain form "0000:18:00.0" as well */
        if (!strcasecmp(mine, bus_id) || (strlen(mine) > 4 && !strcasecmp(mine + 4, bus_id))) {
            *device = &g_dev[i];
            API_RETURN(NVML_SUCCESS);
        }
    }
    API_RETURN(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return handle_by_pci(pciBusId, device);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    return handle_by_pci(pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    API_BEGIN();
    DEVICE(device, "index", 0, g);
    if (!index) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)(g - &g_sc.gpu[0]);
    API_RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Identity                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    API_BEGIN();
    DEVICE(device, "name", 1, g);
    if (device->mig >= 0) {
        char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE + 16];
        snprintf(buf, sizeof buf, "%s MIG", g->name);
        API_RETURN(put_str(name, length, buf));
    }
    API_RETURN(put_str(name, length, g->name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    API_BEGIN();
    DEVICE(device, "uuid", 1, g);
    if (device->mig >= 0) {
        if ((unsigned int)device->mig >= g->n_mig || !g->mig_current) API_RETURN(NVML_ERROR_NOT_FOUND);
        API_RETURN(put_str(uuid, length, g->mig[device->mig].uuid));
    }
    API_RETURN(put_str(uuid, length, g->uuid));
}

static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    API_BEGIN();
    DEVICE(device, "pci", 0, g);
    if (!pci) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof(*pci));
    unsigned int dom = 0, bus = 0, dv = 0, fn = 0;
    sscanf(g->pci_bus_id, "%x:%x:%x.%x", &dom, &bus, &dv, &fn);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dv;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsys_id;
    copy_str(pci->busId, sizeof pci->busId, g->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, dom & 0xFFFF, bus, dv);
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) { return pci_info(device, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { return pci_info(device, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) { return pci_info(device, pci); }

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    API_BEGIN();
    DEVICE(device, "minor", 0, g);
    if (!minorNumber) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *minorNumber = g->minor;
    API_RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Memory, utilisation, processes                                                                     */
/* ------------------------------------------------------------------------------------------------ */

/* A MIG device's memory: its own total, what its processes use, nothing reserved. 0 when not a MIG handle. */
static int mig_memory(nvmlDevice_t device, const gpu_t *g, unsigned long long *total, unsigned long long *used) {
    if (device->mig < 0) return 0;
    const mig_t *m = &g->mig[device->mig];
    *total = m->mem_total ? m->mem_total : g->mem_total / (g->n_mig ? g->n_mig : 1);
    unsigned long long procs = 0;
    gather((int)(g - &g_sc.gpu[0]), device->mig, NULL, 0, &procs);
    *used = procs > *total ? *total : procs;
    return 1;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    API_BEGIN();
    DEVICE(device, "memory", 1, g);
    if (!memory) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total, mused;
    if (mig_memory(device, g, &total, &mused)) {
        memory->total = total;
        memory->used = mused;
        memory->free = total - mused;
        API_RETURN(NVML_SUCCESS);
    }
    unsigned long long used = used_bytes((int)(g - &g_sc.gpu[0]));
    memory->total = g->mem_total;
    memory->used = used + g->mem_reserved; /* v1 folds the reserved memory into "used" */
    memory->free = g->mem_total - memory->used;
    API_RETURN(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    API_BEGIN();
    DEVICE(device, "memory", 1, g);
    if (!memory) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2) API_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, mused;
    if (mig_memory(device, g, &total, &mused)) {
        memory->total = total;
        memory->reserved = 0;
        memory->used = mused;
        memory->free = total - mused;
        API_RETURN(NVML_SUCCESS);
    }
    unsigned long long used = used_bytes((int)(g - &g_sc.gpu[0]));
    memory->total = g->mem_total;
    memory->reserved = g->mem_reserved;
    memory->used = used;
    memory->free = g->mem_total - g->mem_reserved - used;
    API_RETURN(NVML_SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    API_BEGIN();
    DEVICE(device, "utilization", 0, g);
    if (!utilization) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    utilization->gpu = g->util_gpu;
    utilization->memory = g->util_mem;
    API_RETURN(NVML_SUCCESS);
}

/* NVML's two-call protocol: with too small a buffer, report the count and INSUFFICIENT_SIZE. */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos,
                                      int graphics, const char *field) {
    API_BEGIN();
    DEVICE(device, field, 1, g);
    if (!count) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    static listed_t all[MAX_STATIC_PROCS + MAX_REG_PROCS];
    int n_all = gather((int)(g - &g_sc.gpu[0]), device->mig, all, MAX_STATIC_PROCS + MAX_REG_PROCS, NULL);
    unsigned int n = 0;
    for (int i = 0; i < n_all; i++)
        if (all[i].graphics == graphics) all[n++] = all[i];
    if (n == 0) {
        *count = 0;
        API_RETURN(NVML_SUCCESS);
    }
    if (*count < n || !infos) {
        *count = n;
        API_RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = all[i].pid;
        infos[i].usedGpuMemory = all[i].mem;
        int slot = all[i].mig;
        int on_mig = slot >= 0 && (unsigned int)slot < g->n_mig;
        infos[i].gpuInstanceId = on_mig ? g->mig[slot].gi : NA_ID;
        infos[i].computeInstanceId = on_mig ? g->mig[slot].ci : NA_ID;
    }
    *count = n;
    API_RETURN(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    return running_processes(device, infoCount, infos, 0, "compute_procs");
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    return running_processes(device, infoCount, infos, 1, "graphics_procs");
}
#endif
/* nvmlProcessInfo_v2_t has the same layout as nvmlProcessInfo_t in this header. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos) {
    return running_processes(device, infoCount, (nvmlProcessInfo_t *)infos, 0, "compute_procs");
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v2_t *infos) {
    return running_processes(device, infoCount, (nvmlProcessInfo_t *)infos, 1, "graphics_procs");
}

/* ------------------------------------------------------------------------------------------------ */
/* Modes                                                                                              */
/* ------------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    API_BEGIN();
    DEVICE(device, "compute_mode", 0, g);
    if (!mode) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *mode = (nvmlComputeMode_t)g->compute_mode;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    API_BEGIN();
    DEVICE(device, "persistence", 0, g);
    if (!mode) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *mode = g->persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    API_RETURN(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    API_BEGIN();
    DEVICE(device, "mig_mode", 0, g);
    if (!currentMode || !pendingMode) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *currentMode = g->mig_current;
    *pendingMode = g->mig_pending ? g->mig_pending : g->mig_current;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    API_BEGIN();
    DEVICE(device, "mig_devices", 0, g);
    if (!count) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = g->mig_current ? MAX_MIG : 0;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    API_BEGIN();
    DEVICE(device, "mig_devices", 0, g);
    if (!migDevice) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig_current) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= MAX_MIG) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= g->n_mig) API_RETURN(NVML_ERROR_NOT_FOUND);
    *migDevice = &g_mig_dev[g - &g_sc.gpu[0]][index];
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    API_BEGIN();
    DEVICE(device, "mig_devices", 1, g);
    (void)g;
    if (!isMigDevice) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = device->mig >= 0;
    API_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(nvmlDevice_t device, unsigned int *id, int compute) {
    API_BEGIN();
    DEVICE(device, "mig_devices", 1, g);
    if (!id) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (device->mig < 0) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if ((unsigned int)device->mig >= g->n_mig) API_RETURN(NVML_ERROR_NOT_FOUND);
    *id = compute ? g->mig[device->mig].ci : g->mig[device->mig].gi;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) { return instance_id(device, id, 0); }
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) { return instance_id(device, id, 1); }
#endif

/* ------------------------------------------------------------------------------------------------ */
/* ECC, retired pages, row remapping                                                                  */
/* ------------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    API_BEGIN();
    DEVICE(device, "ecc_mode", 0, g);
    if (!current || !pending) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *current = g->ecc_current ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pending = g->ecc_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    API_BEGIN();
    DEVICE(device, "ecc_errors", 0, g);
    if (!eccCounts) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->ecc_current) API_RETURN(NVML_ERROR_NOT_SUPPORTED); /* the driver: no counters with ECC off */
    int unc = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
    int vol = counterType == NVML_VOLATILE_ECC;
    *eccCounts = unc ? (vol ? g->ecc_unc_vol : g->ecc_unc_agg) : (vol ? g->ecc_corr_vol : g->ecc_corr_agg);
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    API_BEGIN();
    DEVICE(device, "retired_pages", 0, g);
    if (!isPending) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *isPending = g->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    API_RETURN(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    API_BEGIN();
    DEVICE(device, "remapped_rows", 0, g);
    if (!corrRows || !uncRows || !isPending || !failureOccurred) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *corrRows = g->remap_corr;
    *uncRows = g->remap_unc;
    *isPending = g->remap_pending;
    *failureOccurred = g->remap_failure;
    API_RETURN(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Clocks, thermals, PCIe                                                                             */
/* ------------------------------------------------------------------------------------------------ */

static nvmlReturn_t clock_events(nvmlDevice_t device, unsigned long long *reasons) {
    API_BEGIN();
    DEVICE(device, "clock_events", 0, g);
    if (!reasons) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (g->clock_events_done < g->clock_events_reads) {  /* a bit set for an instant (a P-state change) */
        g->clock_events_done++;
        *reasons = g->clock_events_first;
    } else {
        *reasons = g->clock_events;
    }
    API_RETURN(NVML_SUCCESS);
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons) {
    return clock_events(device, clocksEventReasons);
}
#endif
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *clocksThrottleReasons) {
    return clock_events(device, clocksThrottleReasons);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    API_BEGIN();
    DEVICE(device, "temperature", 0, g);
    if (!temp || sensorType != NVML_TEMPERATURE_GPU) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temp;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    API_BEGIN();
    DEVICE(device, "power", 0, g);
    if (!power) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *power = g->power_mw;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t thresholdType,
                                               unsigned int *temp) {
    API_BEGIN();
    DEVICE(device, "temperature_threshold", 0, g);
    if (!temp) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (thresholdType == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) *temp = g->temp_slowdown;
    else if (thresholdType == NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) *temp = g->temp_shutdown;
    else API_RETURN(NVML_ERROR_NOT_SUPPORTED);
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth) {
    API_BEGIN();
    DEVICE(device, "pcie_width", 0, g);
    if (!currLinkWidth) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *currLinkWidth = g->pcie_width;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth) {
    API_BEGIN();
    DEVICE(device, "pcie_width_max", 0, g);
    if (!maxLinkWidth) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *maxLinkWidth = g->pcie_width_max;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen) {
    API_BEGIN();
    DEVICE(device, "pcie_gen", 0, g);
    if (!currLinkGen) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *currLinkGen = g->pcie_gen;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen) {
    API_BEGIN();
    DEVICE(device, "pcie_gen_max", 0, g);
    if (!maxLinkGen) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *maxLinkGen = g->pcie_gen_max;
    API_RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* NVLink: per-link state (the old entry point; the field values below answer it in one call)        */
/* ------------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    API_BEGIN();
    DEVICE(device, "nvlink", 0, g);
    if (!isActive) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->nvlink_links) API_RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (link >= g->nvlink_links) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *isActive = (g->nvlink_down >> link) & 1ULL ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    API_RETURN(NVML_SUCCESS);
}

/* One NVLink field value: the link count, or one link's state (scopeId = the link). */
static void nvlink_field(nvmlDevice_t device, const gpu_t *g, nvmlFieldValue_t *v) {
    nvmlReturn_t c = device_check(device, "nvlink", 0, NULL);
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.uiVal = 0;
    if (c == NVML_SUCCESS && !g->nvlink_links) c = NVML_ERROR_NOT_SUPPORTED;
    if (c == NVML_SUCCESS && v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
        v->value.uiVal = g->nvlink_links;
    } else if (c == NVML_SUCCESS) { /* NVML_FI_DEV_NVLINK_GET_STATE */
#ifdef FAKE_OLD_DRIVER
        c = NVML_ERROR_NOT_SUPPORTED; /* a driver that predates the field: callers fall back per link */
#else
        if (v->scopeId >= g->nvlink_links) c = NVML_ERROR_INVALID_ARGUMENT;
        else v->value.uiVal = (g->nvlink_down >> v->scopeId) & 1ULL ? NVML_NVLINK_STATE_INACTIVE : NVML_NVLINK_STATE_ACTIVE;
#endif
    }
    v->nvmlReturn = c;
}

/* ------------------------------------------------------------------------------------------------ */
/* Field values (GPU recovery action, NVLink)                                                                 */
/* ------------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    API_BEGIN();
    DEVICE(device, "field_values", 0, g);
    if (!values || valuesCount < 0) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long stamp = (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = stamp;
        v->latencyUsec = 0;
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            nvmlReturn_t c = device_check(device, "recovery_action", 0, NULL);
            v->nvmlReturn = c;
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = c == NVML_SUCCESS ? g->recovery_action : 0;
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT || v->fieldId == NVML_FI_DEV_NVLINK_GET_STATE) {
            nvlink_field(device, g, v);
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    API_RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Events (XID)                                                                                       */
/* ------------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    API_BEGIN();
    REQUIRE_INIT();
    if (!set) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
    if (!s) API_RETURN(NVML_ERROR_MEMORY);
    s->created = now_mono();
    *set = s;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    API_BEGIN();
    REQUIRE_INIT();
    free(set);
    API_RETURN(NVML_SUCCESS);
}

#define FAKE_SUPPORTED_EVENTS (nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | \
                               nvmlEventTypeDoubleBitEccError | nvmlEventTypeClock)

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    API_BEGIN();
    DEVICE(device, "events", 0, g);
    (void)g;
    if (!eventTypes) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = FAKE_SUPPORTED_EVENTS;
    API_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    API_BEGIN();
    DEVICE(device, "events", 0, g);
    if (!set) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~FAKE_SUPPORTED_EVENTS) API_RETURN(NVML_ERROR_NOT_SUPPORTED);
    set->mask[g - &g_sc.gpu[0]] |= eventTypes;
    API_RETURN(NVML_SUCCESS);
}

/* Deliver each scenario XID once per process (a rewrite of the scenario that keeps the line does not deliver it
 * again) to a set that watches its GPU, no earlier than after_ms after the later of the set's creation and the
 * moment this process first read the line: an XID written into the scenario while a long-lived set is polled
 * arrives after_ms after the fake notices it. Otherwise wait until the timeout, re-reading the scenario.
 * `event_wait_error` makes every wait answer that error at once (a broken event API); `event_wait_hang=1` makes
 * every wait block, whatever its timeout, until the line is gone (an NVML call that never returns). */
static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    pthread_mutex_lock(&g_lock);
    g_calls++;
    if (g_init_count <= 0) API_RETURN(NVML_ERROR_UNINITIALIZED);
    if (!set || !data) API_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    double deadline = now_mono() + timeoutms / 1000.0;
    for (;;) {
        reload(0);
        if (g_sc.event_wait_error != NVML_SUCCESS) API_RETURN(g_sc.event_wait_error);
        if (g_sc.event_wait_hang) { /* blocked past any timeout until the scenario drops the line */
            pthread_mutex_unlock(&g_lock);
            struct timespec hang = {0, 5000000L};
            nanosleep(&hang, NULL);
            pthread_mutex_lock(&g_lock);
            continue;
        }
        double now = now_mono(), next_due = deadline;
        for (int i = 0; i < g_sc.n_xid; i++) {
            const xid_t *x = &g_sc.xid[i];
            if (g_xid_delivered[i] || x->gpu >= (unsigned int)g_sc.gpu_count) continue;
            if (!(set->mask[x->gpu] & nvmlEventTypeXidCriticalError)) continue;
            double start = set->created > g_xid_seen[i] ? set->created : g_xid_seen[i];
            double due = start + x->after_ms / 1000.0;
            if (due <= now) {
                g_xid_delivered[i] = 1;
                data->device = &g_dev[x->gpu];
                data->eventType = nvmlEventTypeXidCriticalError;
                data->eventData = x->code;
                data->gpuInstanceId = NA_ID;
                data->computeInstanceId = NA_ID;
                API_RETURN(NVML_SUCCESS);
            }
            if (due < next_due) next_due = due;
        }
        if (now >= deadline) API_RETURN(NVML_ERROR_TIMEOUT);
        double step = next_due - now;
        if (step > 0.005) step = 0.005; /* notice scenario changes while waiting */
        if (step < 0.0002) step = 0.0002;
        pthread_mutex_unlock(&g_lock);
        struct timespec ts = {(time_t)step, (long)((step - (double)(time_t)step) * 1e9)};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_lock);
    }
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return event_wait(set, data, timeoutms);
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return event_wait(set, data, timeoutms);
}
