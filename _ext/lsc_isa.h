/* lsc_isa.h: the ISA levels of lscore's dispatched CPU kernels, one list for
 * every kernel family (the scan in lsc_scan.h, the float8 casts in
 * lsc_fp8.h).  On x86-64 with GCC >= 12: the x86-64-v2 baseline the
 * extension is built for and copies compiled under `#pragma GCC target` for
 * -v3 and -v4, picked by __builtin_cpu_supports; elsewhere one "baseline"
 * level.  A family keeps its own table of kernels, one entry per level in
 * this order, and its own active pointer; which levels this CPU runs, and the
 * choice of one by name, are here. */
#ifndef LSC_ISA_H
#define LSC_ISA_H

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

#endif /* LSC_ISA_H */
