/* lsc_fp8_scale.h: float8 scales from amaxes, by TransformerEngine's and
 * torchao's rules, and TransformerEngine's delayed-scaling state machine.
 *
 * Design: two current-scaling rules, elementwise over float32 amaxes, and
 * one struct with one update for the delayed scaling of n tensors.  Each
 * function follows its reference's source line for line; the citations are
 * NVIDIA/TransformerEngine at tag v2.18 ("TE") and pytorch/ao at tag
 * v0.18.0 ("ao").  lscore/fp8/recipes.py names the parameter sets,
 * lscore/fp8/delayed.py validates and drives the state, and the slow twin of
 * every function is lscore/_reference_fp8.py (fp8_scale_te, fp8_scale_torchao,
 * fp8_delayed_record, fp8_delayed_update).
 *
 * Like lsc_fp8.h the header is plain C99 that also compiles as CUDA (LSC_FN),
 * so a device kernel can run the very same rules; it needs no -ffast-math
 * (a division must round to nearest, as __fdiv_rn does) and the host build's
 * -ffp-contract=off keeps every product and quotient a single rounding.
 */
#ifndef LSC_FP8_SCALE_H
#define LSC_FP8_SCALE_H

#include "lsc_codes.h"
#include "lsc_half.h"

#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

#define LSC_FP8_FLT_MAX 3.40282346638528859812e+38f

/* amax selection of the delayed update (TE's amax_compute_algo) */
enum { LSC_FP8_AMAX_MAX = 0, LSC_FP8_AMAX_MOST_RECENT = 1 };

/* CUDA's fmaxf: a NaN argument yields the other one (both NaN: NaN), so a
 * reduction that starts from 0 skips NaN elements.  Of two equal values
 * (+0 and -0) it keeps the first, the running maximum, as TE's integer
 * atomic max on the bits keeps +0 over -0. */
LSC_FN float lsc_fp8_fmaxf(float a, float b)
{
    if (a != a)
        return b;
    if (b != b)
        return a;
    return b > a ? b : a;
}

/* TE's compute_scale_from_amax
 * (TE:transformer_engine/common/recipe/recipe_common.cuh:14-49) with its
 * value_for_inf: an amax below eps becomes eps (NaN passes through the
 * comparison); an Inf, 0 or NaN amax gives 1; otherwise fp8_max / amax
 * rounded to nearest, +Inf replaced by inf_value, and with pow2 the 23
 * mantissa bits cleared (rounded down to a power of two; a subnormal scale
 * becomes 0).  Float8BlockScaling's kernels pass the input dtype's largest
 * value as inf_value (recipe_common.cuh:61-69, compute_scale_from_types). */
LSC_FN float lsc_fp8_scale_te_inf(float amax, float fp8_max, int pow2, float eps, float inf_value)
{
    float scale;
    if (amax < eps)
        amax = eps;
    if (amax != amax || amax == 0.0f || amax > LSC_FP8_FLT_MAX || amax < -LSC_FP8_FLT_MAX)
        return 1.0f;
    scale = fp8_max / amax;
    if (scale > LSC_FP8_FLT_MAX || scale < -LSC_FP8_FLT_MAX)
        scale = inf_value;
    if (pow2)
        scale = lsc_f32_from_bits(lsc_f32_bits(scale) & 0xFF800000u);
    return scale;
}

/* TE's current-scaling rule: compute_scale_from_amax with value_for_inf =
 * FLT_MAX, as Float8CurrentScaling calls it
 * (TE:transformer_engine/common/recipe/current_scaling.cu:267-276). */
LSC_FN float lsc_fp8_scale_te(float amax, float fp8_max, int pow2, float eps)
{
    return lsc_fp8_scale_te_inf(amax, fp8_max, pow2, eps, LSC_FP8_FLT_MAX);
}

/* torchao's power-of-two rounding, _round_scale_down_to_power_of_2
 * (ao:torchao/float8/float8_utils.py:244-246): exp2(floor(log2(s))) in
 * float32 torch ops.  torch's float32 log2 on the CPU returns the float32
 * nearest the exact logarithm, so a scale just below 2^m whose logarithm
 * rounds up to the integer m gives 2^m, not 2^(m-1): none below 2^1 or 2^2,
 * one ulp below 2^3 and 2^4, two below 2^7, 44 below 2^127 and below 2^128
 * (exp2 of an integer is exact, and of 128 is +Inf).  Zero gives 0, +Inf
 * +Inf, NaN and negative scales NaN.  This function equals torch 2.13's
 * exp2(floor(log2(s))) bit for bit on every non-negative float32 (an
 * exhaustive sweep on the CPU);
 * tests/core/data/torchao_scales.npz holds torchao's outputs near every
 * power of two. */
LSC_FN float lsc_fp8_pow2_down_torch(float s)
{
    int e;
    if (s != s || s < 0.0f)
        return s != s ? s : lsc_f32_from_bits(0x7FC00000u);
    if (s == 0.0f)
        return 0.0f;
    if (s > LSC_FP8_FLT_MAX)
        return s;
    e = (int)floorf((float)log2((double)s));
    if (e >= 128)
        return lsc_f32_from_bits(0x7F800000u);
    if (e >= -126)
        return lsc_f32_from_bits((lsc_u32)(e + 127) << 23);
    return lsc_f32_from_bits(1u << (e + 149));      /* a subnormal power of two */
}

/* torchao's rule, amax_to_scale (ao:torchao/float8/float8_utils.py:31-53):
 * the amax widened to float64, clamped below at eps (torch.clamp: NaN stays
 * NaN), finfo(dtype).max divided by it in float64, the quotient rounded to
 * float32, then optionally rounded down to a power of two as above.  An Inf
 * amax gives 0, a NaN amax NaN. */
LSC_FN float lsc_fp8_scale_torchao(float amax, double fp8_max, int pow2, double eps)
{
    double a = (double)amax;
    float scale;
    if (a < eps)
        a = eps;
    scale = (float)(fp8_max / a);
    return pow2 ? lsc_fp8_pow2_down_torch(scale) : scale;
}

/* ---- delayed scaling ------------------------------------------------------
 * The state of n tensors as TE keeps it per module and direction
 * (TE:transformer_engine/pytorch/quantization.py:1423-1441): history
 * [len][n] float32, row 0 the current slot that every cast of a step
 * max-accumulates into, the older amaxes below it in TE's row order
 * (physically rolled as TE rolls it, not a ring: a tensor whose current
 * amax is 0 does not roll while the others do), scale [n] (1 at first) and
 * scale_inv [n].  The caller owns the arrays. */
typedef struct {
    lsc_i64 n;                /* tensors */
    lsc_i64 len;              /* history rows */
    int algo;                 /* LSC_FP8_AMAX_MAX or LSC_FP8_AMAX_MOST_RECENT */
    int amax_nan;             /* record: 1 = a NaN amax makes the slot NaN (torch.max),
                                 0 = it is skipped (TE's fmaxf) */
    float *history;           /* [len][n] */
    float *scale;             /* [n] */
    float *scale_inv;         /* [n] */
    const float *scaled_max;  /* [n]: fp8_max * 2^-margin of each tensor's format */
    float *work;              /* [2n] scratch of the update */
} lsc_fp8_delayed;

/* TE's scaled_max = fp8_max * powf(2, -margin), in float32
 * (TE:transformer_engine/common/recipe/delayed_scaling.cu:299-300, 331). */
LSC_FN float lsc_fp8_scaled_max(float fp8_max, int margin)
{
    return fp8_max * (float)pow(2.0, (double)-margin);
}

/* Max-accumulate one amax per tensor into the current row: several casts
 * between two updates (micro-batches) keep their running maximum, as TE's
 * casts do with an atomic max into amax_history[0]
 * (TE:transformer_engine/pytorch/csrc/quantizer.cpp:613-625). */
LSC_FN void lsc_fp8_delayed_record(lsc_fp8_delayed *s, const float *amax)
{
    lsc_i64 j;
    float *h = s->history;
    for (j = 0; j < s->n; j++) {
        float a = amax[j], r = h[j];
        if (s->amax_nan && (a != a || r != r))
            h[j] = a != a ? a : r;
        else
            h[j] = lsc_fp8_fmaxf(r, a);
    }
}

/* One update of all n tensors: TE's fused bulk kernel
 * (TE:transformer_engine/common/recipe/delayed_scaling.cu:162-253), then the
 * scale inverse as the casts write it, the IEEE reciprocal 1 / scale
 * (__frcp_rn, TE:transformer_engine/common/utils.cuh:944-952).  For each
 * tensor with current amax c = history[0]:
 *   c == 0: no roll and amax 0, so the scale stays (a module that did not
 *           run; TE PR #825);
 *   else:   "max" amax = fmaxf over c and rows 1..len-1 (NaN skipped), or
 *           "most_recent" amax = c; rows roll up by one: row 0 becomes 0,
 *           row i the old row i+1, the last row c (the oldest, row 1, goes);
 *   scale = scaled_max / amax when amax is finite and > 0 (+Inf -> FLT_MAX),
 *           else the old scale.
 * A reduced amax from other workers is written into row 0 first. */
LSC_FN void lsc_fp8_delayed_update(lsc_fp8_delayed *s)
{
    lsc_i64 i, j, n = s->n, len = s->len, rolled = 0;
    float *h = s->history, *amax = s->work, *last = s->work + n;
    /* the amax: a running maximum from 0 that takes a value only when it is
       larger skips NaN values as fmaxf does, and has no branch (the loops
       over a row vectorise); a tensor that does not roll keeps amax 0 */
    for (j = 0; j < n; j++) {
        last[j] = h[j];
        amax[j] = h[j] > 0.0f ? h[j] : 0.0f;
    }
    if (s->algo == LSC_FP8_AMAX_MAX)
        for (i = 1; i < len; i++)
            for (j = 0; j < n; j++)
                amax[j] = h[i * n + j] > amax[j] ? h[i * n + j] : amax[j];
    for (j = 0; j < n; j++) {
        float keep = s->algo == LSC_FP8_AMAX_MOST_RECENT ? last[j] : amax[j];
        amax[j] = last[j] != 0.0f ? keep : 0.0f;
        rolled += last[j] != 0.0f;
    }
    /* the roll: every row moves up by one, row by row (rows are contiguous),
       in one plain copy when every tensor rolls */
    if (rolled == n) {
        for (i = 0; i < (len - 1) * n; i++)
            h[i] = h[i + n];
    } else {
        for (i = 0; i + 1 < len; i++)
            for (j = 0; j < n; j++)
                h[i * n + j] = last[j] != 0.0f ? h[(i + 1) * n + j] : h[i * n + j];
    }
    for (j = 0; j < n; j++)
        if (last[j] != 0.0f) {
            h[(len - 1) * n + j] = last[j];
            h[j] = 0.0f;
        }
    for (j = 0; j < n; j++) {
        float a = amax[j], scale = s->scale[j];
        if (a > 0.0f && a <= LSC_FP8_FLT_MAX)
            scale = s->scaled_max[j] / a;
        if (scale > LSC_FP8_FLT_MAX)
            scale = LSC_FP8_FLT_MAX;
        s->scale[j] = scale;
        s->scale_inv[j] = 1.0f / scale;
    }
}

#endif /* LSC_FP8_SCALE_H */
