/* lsc_codes.h: the one definition of the numbers the layers of lscore share.
 *
 * Design: dtype codes (and what each format is: width, exponent field),
 * the parameter enums, flag bits and return values of the state machine
 * (lsc_state.h), and the slots of the device state (update.cu) are written
 * here once.  The C core, the CUDA kernels (NVRTC, no toolkit headers), the
 * host test harness (g++) and the Cython modules include this file;
 * _codes.pyx exports it to Python (lscore/_dtypes.py reads its codes there).
 * It also holds the two things every header needs in all three compilers:
 * fixed-width words and the function qualifier LSC_FN.
 */
#ifndef LSC_CODES_H
#define LSC_CODES_H

/* ---- words and function qualifier: C99, NVRTC and g++ alike ------------- */

#if defined(__CUDACC_RTC__)
typedef unsigned short lsc_u16;
typedef int lsc_i32;
typedef unsigned int lsc_u32;
typedef long long lsc_i64;
typedef unsigned long long lsc_u64;
#else
#include <stdint.h>
typedef uint16_t lsc_u16;
typedef int32_t lsc_i32;
typedef uint32_t lsc_u32;
typedef int64_t lsc_i64;
typedef uint64_t lsc_u64;
#endif

#if defined(__CUDACC__)
#define LSC_FN static __host__ __device__ inline
#else
#define LSC_FN static inline
#endif

/* ---- dtype codes -------------------------------------------------------- */

enum {
    LSC_CODE_INT = 0,   /* integer or bool: always finite, never written */
    LSC_CODE_F16 = 1,
    LSC_CODE_BF16 = 2,
    LSC_CODE_F32 = 3,
    LSC_CODE_F64 = 4,
    LSC_CODE_E4M3FN = 5,
    LSC_CODE_E5M2 = 6,
    LSC_NCODES = 7
};

/* bytes per element of each code */
enum {
    LSC_WIDTH_INT = 0,
    LSC_WIDTH_F16 = 2,
    LSC_WIDTH_BF16 = 2,
    LSC_WIDTH_F32 = 4,
    LSC_WIDTH_F64 = 8,
    LSC_WIDTH_E4M3FN = 1,
    LSC_WIDTH_E5M2 = 1
};

/* exponent field of each float code and its lowest bit: a word is NaN or Inf
 * exactly when (w & EXP) + EXP_LSB carries into the word's top bit */
#define LSC_EXP_F16         0x7C00u
#define LSC_EXP_LSB_F16     0x0400u
#define LSC_EXP_BF16        0x7F80u
#define LSC_EXP_LSB_BF16    0x0080u
#define LSC_EXP_F32         0x7F800000u
#define LSC_EXP_LSB_F32     0x00800000u
#define LSC_EXP_F64         0x7FF0000000000000ull
#define LSC_EXP_LSB_F64     0x0010000000000000ull
#define LSC_EXP_E4M3FN      0x7Fu      /* NaN is S.1111.111, no Inf: the field and mantissa */
#define LSC_EXP_LSB_E4M3FN  0x01u
#define LSC_EXP_E5M2        0x7Cu
#define LSC_EXP_LSB_E5M2    0x04u

/* ---- the state machine (lsc_state.h) ------------------------------------ */

/* arithmetic precision of the scale */
enum {
    LSC_PREC_F32 = 0,      /* float32 scale, factor rounded to float32, float32 op (TF, Keras, Megatron, Paddle, jmp) */
    LSC_PREC_F32_F64 = 1,  /* float32 scale, op in double, rounded back to float32 (torch) */
    LSC_PREC_F64 = 2       /* Python float (DeepSpeed, fairseq, apex, chainer) */
};

/* when a run of finite steps grows the scale */
enum {
    LSC_GROW_GE = 0,       /* good + 1 >= interval: grow, good = 0 (TF; interval <= 1 grows every step) */
    LSC_GROW_EQ = 1,       /* good + 1 == interval: grow, good = 0 (torch, Keras 3, jmp, apex; <= 0 never) */
    LSC_GROW_MODULO = 2,   /* good counts finite steps since the last overflow and is not reset by growth;
                              grow when k = good - offset > 0 and k % interval == 0 (DeepSpeed, fairseq) */
    LSC_GROW_NEVER = 3     /* a fixed scale */
};

/* how a backoff computes the new scale */
enum {
    LSC_BACKOFF_MUL = 0,   /* scale * backoff_factor (torch, Megatron, TF1) */
    LSC_BACKOFF_DIV = 1    /* scale / growth_factor  (TF2, Keras 2, jmp, DeepSpeed, fairseq) */
};

/* whether the policy gives up at floor_scale (min_scale clamps in every mode) */
enum {
    LSC_MIN_CLAMP = 0,        /* never gives up */
    LSC_MIN_RAISE_AT = 1,     /* a backoff due while scale == floor_scale: raise, state untouched (DeepSpeed) */
    LSC_MIN_RAISE_BELOW = 2   /* an overflow step leaves the scale <= floor_scale: the old scale is kept,
                                 the step's counters are committed but the step is not counted (fairseq) */
};

/* flags */
#define LSC_GUARD_FINITE    (1u << 0)  /* refuse a growth whose result is not finite in the working precision */
#define LSC_HAS_MIN         (1u << 1)
#define LSC_HAS_MAX         (1u << 2)  /* cap a growth at max_scale */
#define LSC_REFILL_FINITE   (1u << 3)  /* hysteresis_left := hysteresis on every finite step */
#define LSC_REFILL_GROWTH   (1u << 4)  /* ... on every growth (attempted or not) */
#define LSC_REFILL_BACKOFF  (1u << 5)  /* ... on every backoff */
#define LSC_HYST_SATURATE   (1u << 6)  /* hysteresis_left never stays below 1 after an overflow (DeepSpeed);
                                          else it goes negative (Megatron) */
#define LSC_APPLY_NONFINITE (1u << 7)  /* should_apply is true even for a non-finite step (TF FixedLossScale) */
#define LSC_FTZ             (1u << 8)  /* float32 results below the smallest normal flush to zero (TF on CPU) */
#define LSC_APPLY_NEXT      (1u << 9)  /* the computed scale takes effect one update later (MXNet) */
#define LSC_HAS_LATE_GROWTH (1u << 10) /* after the first overflow ever, grow by growth_factor_after_overflow (Chainer) */

/* return codes of lsc_update */
#define LSC_SKIP 0
#define LSC_APPLY 1
#define LSC_FLOOR_ERROR (-1)

/* ---- the device state (update.cu) --------------------------------------- */

/* the uint32 flags beside the device lsc_state, by index */
enum {
    LSC_DEV_FOUND = 0,     /* set by the scan kernels; cleared by each update */
    LSC_DEV_FLOOR = 1,     /* the update returned LSC_FLOOR_ERROR; cleared by the host */
    LSC_DEV_APPLY = 2,     /* this step's decision: 1 apply, 0 skip */
    LSC_DEV_NFLAGS = 4     /* one spare, so the values after them are 8-byte aligned */
};

/* the float64 values after the flags, by index */
enum {
    LSC_DEV_INV_SCALE = 0, /* inv_scale for the next unscale */
    LSC_DEV_SCALE = 1,     /* the scale */
    LSC_DEV_NVALS = 2
};

/* ---- the fused optimizers (optim.cu) -------------------------------------- */

/* bits of lsc_mt_sgd's and lsc_mt_adam's `flags` */
enum {
    LSC_OPT_SLOT = 1,         /* SGD: a momentum slot (the host's momentum != 0) */
    LSC_OPT_NESTEROV = 2,     /* SGD: nesterov */
    LSC_OPT_MAXIMIZE = 4,     /* both: ascend (the gradient negated after unscaling) */
    LSC_OPT_AMSGRAD = 8,      /* Adam: keep the running maximum of v (record slot 4) */
    LSC_OPT_CHECK = 16,       /* both: only check (the host launches lsc_mt_opt_check: skip_if
                                 at gate on a non-finite unscaled gradient, nothing else) */
    LSC_OPT_INV_AS_GRAD = 32  /* both: round the inverse to the gradient's dtype first, as a
                                 framework multiplying in that dtype does (NumPy adapter) */
};

/* ---- the multi-tensor kernel argument (scan.cu's lsc_meta) --------------- */

/* tensors and blocks one launch's argument holds: torch's depth-1 figures for
 * 4 KB of kernel parameters, and its 32 KB ones (CUDA >= 12.1, sm_70+) */
enum {
    LSC_META_4K_TENSORS = 110,
    LSC_META_4K_BLOCKS = 320,
    LSC_META_32K_TENSORS = 770,
    LSC_META_32K_BLOCKS = 2240
};

/* the fused optimizers' argument structs (optim.cu's lsc_opt_meta): addresses
 * per tensor (SGD {grad, param, momentum}, Adam {grad, param, m, v, vhat}) and
 * the tensors one holds, torch's figures for those depths in 4 KB and 32 KB of
 * kernel parameters; blocks as lsc_meta's */
enum {
    LSC_SGD_DEPTH = 3,
    LSC_ADAM_DEPTH = 5,
    LSC_SGD_4K_TENSORS = 48,
    LSC_SGD_32K_TENSORS = 336,
    LSC_ADAM_4K_TENSORS = 30,
    LSC_ADAM_32K_TENSORS = 210
};

/* ---- the one-pass norm (scan.cu) ----------------------------------------- */

/* bits of lsc_mt_unscale_norm's `nflags` */
enum {
    LSC_NORM_INF = 1,     /* the inf-norm (else the 2-norm) */
    LSC_NORM_FIRST = 2,   /* the call's first launch: its running total starts here */
    LSC_NORM_LAST = 4     /* the call's last launch: it writes the result */
};

#endif /* LSC_CODES_H */
