/* lsc_isa.h: the ISA levels of lscore's dispatched CPU kernels, one list for
 * every kernel family (the scan in lsc_scan.h, the float8 casts in
 * lsc_fp8.h, the MX block passes in lsc_mx.h).  On x86-64 with GCC >= 12:
 * the x86-64-v2 baseline the extension is built for and kernels for -v3 and
 * -v4 (the MX passes: one unit per level, lsc_mx_kern.c, compiled with the
 * level's flags by setup.py; the others: copies under `#pragma GCC
 * target`), picked by __builtin_cpu_supports; elsewhere one "baseline"
 * level.  A family keeps its own table of kernels for each level, in this
 * order, in an lsc_isa_family; which levels this CPU runs, and the choice
 * of one by name, are here. */
#ifndef LSC_ISA_H
#define LSC_ISA_H

#include <stdatomic.h>
#include <string.h>

/* A level's kernel table defined in one unit of the extension and read by
 * another: not exported from the extension's shared object. */
#if defined(__GNUC__)
#define LSC_ISA_TABLE __attribute__((visibility("hidden")))
#else
#define LSC_ISA_TABLE
#endif

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__) && !defined(__clang__) \
        && __GNUC__ >= 12 && !defined(LSC_NO_DISPATCH)
#define LSC_X86_DISPATCH 1
#define LSC_NISAS 3
static const char *const lsc_isa_names[LSC_NISAS] = {"v2", "v3", "v4"};

static inline int lsc_isa_supported(int level)
{
    __builtin_cpu_init();
    if (level == 2)
        return __builtin_cpu_supports("x86-64-v4");
    if (level == 1)
        return __builtin_cpu_supports("x86-64-v3");
    return 1;   /* the build baseline */
}
#else
#define LSC_NISAS 1
static const char *const lsc_isa_names[LSC_NISAS] = {"baseline"};

static inline int lsc_isa_supported(int level) { return level == 0; }
#endif

/* The level named `name` ("v2", "v3", "v4"; "" or NULL = the best this CPU
 * runs), or -1 when the name is unknown or this CPU cannot run it. */
static inline int lsc_isa_find(const char *name)
{
    int best = 0;
    for (int k = 0; k < LSC_NISAS; k++) {
        if (!lsc_isa_supported(k))
            continue;
        best = k;
        if (name && *name && strcmp(name, lsc_isa_names[k]) == 0)
            return k;
    }
    return name && *name ? -1 : best;
}

/* A kernel family's levels: its table for each level, in the order above,
 * and the one in use, read by every call and written by lsc_isa_choose
 * (tests and the bench pick levels by name): an atomic pointer, relaxed, as
 * it only ever points at constant tables. */
typedef struct {
    const void *const *tables;
    _Atomic(const void *) active;
} lsc_isa_family;

/* Make the level named `name` (lsc_isa_find's names) f's.  Returns 0, or -1
 * when the name is unknown or this CPU cannot run it. */
static inline int lsc_isa_choose(lsc_isa_family *f, const char *name)
{
    int k = lsc_isa_find(name);
    if (k < 0)
        return -1;
    atomic_store_explicit(&f->active, f->tables[k], memory_order_relaxed);
    return 0;
}

/* f's table in use: the best level this CPU runs until one is chosen. */
static inline const void *lsc_isa_table(lsc_isa_family *f)
{
    const void *t = atomic_load_explicit(&f->active, memory_order_relaxed);
    if (!t) {
        lsc_isa_choose(f, NULL);
        t = atomic_load_explicit(&f->active, memory_order_relaxed);
    }
    return t;
}

#endif /* LSC_ISA_H */
