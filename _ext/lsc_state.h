/* lsc_state.h: the loss-scale state machine, one struct and one update function.
 *
 * Design: every policy lscore knows (TF2, TF1, Keras, torch, apex, DeepSpeed,
 * Megatron, NeMo, Paddle, jmp, ...) is a parameter set of this one machine;
 * lscore/policy.py validates and names the parameters, lscore/presets/table.py
 * maps each peer onto them.  The spec, as readable pseudocode, is the
 * docstring of lscore/_reference.py:update; this file must agree with it.
 *
 * The header is plain C99 and also compiles as CUDA (NVRTC, no toolkit
 * headers), so the device-side update kernel in update.cu runs the very same
 * transition as the CPU core.  Its enums, flag bits and return codes are
 * in lsc_codes.h.
 */
#ifndef LSC_STATE_H
#define LSC_STATE_H

#include "lsc_codes.h"

#define LSC_F32_MAX 3.4028234663852886e38
#define LSC_F32_MIN_NORMAL 1.1754943508222875e-38
#define LSC_F64_MAX 1.7976931348623157e308

typedef struct {
    /* parameters */
    double growth_factor;
    double backoff_factor;
    double min_scale;
    double max_scale;
    lsc_i64 growth_interval;
    lsc_i64 growth_offset;
    lsc_i64 hysteresis;
    int precision;
    int growth_mode;
    int backoff_mode;
    int min_action;
    lsc_u32 flags;
    lsc_u32 _pad;
    /* state */
    double scale;
    double next_scale;          /* LSC_APPLY_NEXT only */
    lsc_i64 good_steps;         /* the growth counter */
    lsc_i64 hysteresis_left;    /* overflows still absorbed before a backoff */
    lsc_i64 steps;              /* updates taken (a raise does not count) */
    lsc_i64 skipped;            /* updates that returned LSC_SKIP */
    double tolerance;           /* parameter: back off only if overflows / steps since the last
                                   rescale >= tolerance (fairseq; 0 = always) */
    double floor_scale;         /* parameter: where min_action gives up */
    double growth_factor_after_overflow;  /* parameter, with LSC_HAS_LATE_GROWTH */
    lsc_i64 overflows;          /* overflow steps since the last backoff */
    lsc_i64 since_rescale;      /* steps since the last growth or backoff */
    lsc_i64 overflow_seen;      /* 1 once any overflow was seen */
} lsc_state;

LSC_FN int lsc_is_finite(double x, int precision)
{
    double m = precision == LSC_PREC_F64 ? LSC_F64_MAX : LSC_F32_MAX;
    return x <= m && x >= -m;   /* false for NaN */
}

LSC_FN double lsc_round(const lsc_state *s, double x)
{
    if (s->precision == LSC_PREC_F64)
        return x;
    x = (double)(float)x;
    if ((s->flags & LSC_FTZ) && x < LSC_F32_MIN_NORMAL && x > -LSC_F32_MIN_NORMAL)
        x = x < 0 ? -0.0 : 0.0;
    return x;
}

LSC_FN double lsc_mul(const lsc_state *s, double x, double f)
{
    if (s->precision == LSC_PREC_F32)
        return lsc_round(s, (double)((float)x * (float)f));
    return lsc_round(s, x * f);
}

LSC_FN double lsc_div(const lsc_state *s, double x, double f)
{
    if (s->precision == LSC_PREC_F32)
        return lsc_round(s, (double)((float)x / (float)f));
    return lsc_round(s, x / f);
}

LSC_FN double lsc_backoff_value(const lsc_state *s, double x)
{
    return s->backoff_mode == LSC_BACKOFF_DIV ? lsc_div(s, x, s->growth_factor)
                                              : lsc_mul(s, x, s->backoff_factor);
}

/* One transition.  `finite` says whether every gradient of the step was
 * finite.  Returns LSC_APPLY, LSC_SKIP or LSC_FLOOR_ERROR (then nothing
 * changed but what the policy itself changes before giving up). */
LSC_FN int lsc_update(lsc_state *s, int finite)
{
    int apply = finite || (s->flags & LSC_APPLY_NONFINITE);
    /* with LSC_APPLY_NEXT the rule works on next_scale and the scale of the
       coming step becomes the one computed at the previous update */
    double work = (s->flags & LSC_APPLY_NEXT) ? s->next_scale : s->scale;
    lsc_i64 good = s->good_steps, left = s->hysteresis_left;
    lsc_i64 overflows = s->overflows, since = s->since_rescale + 1, seen = s->overflow_seen;

    if (s->growth_mode == LSC_GROW_NEVER) {
        s->steps += 1;
        s->skipped += !apply;
        return apply ? LSC_APPLY : LSC_SKIP;
    }
    if (finite) {
        int grow;
        if (s->flags & LSC_REFILL_FINITE)
            left = s->hysteresis;
        if (s->growth_mode == LSC_GROW_MODULO) {
            lsc_i64 k;
            good += 1;
            k = good - s->growth_offset;
            grow = k > 0 && s->growth_interval > 0 && k % s->growth_interval == 0;
        } else {
            lsc_i64 t = good + 1;
            grow = s->growth_mode == LSC_GROW_GE ? t >= s->growth_interval
                                                 : t == s->growth_interval;
            good = grow ? 0 : t;
        }
        if (grow) {
            double f = ((s->flags & LSC_HAS_LATE_GROWTH) && seen)
                       ? s->growth_factor_after_overflow : s->growth_factor;
            double x = lsc_mul(s, work, f);
            if ((s->flags & LSC_GUARD_FINITE) && !lsc_is_finite(x, s->precision))
                x = work;
            if ((s->flags & LSC_HAS_MAX) && x > lsc_round(s, s->max_scale))
                x = lsc_round(s, s->max_scale);
            work = x;
            since = 0;
            if (s->flags & LSC_REFILL_GROWTH)
                left = s->hysteresis;
        }
    } else {
        left -= 1;
        overflows += 1;
        seen = 1;
        if (left <= 0 && (double)overflows / (double)since >= s->tolerance) {
            double x;
            if (s->min_action == LSC_MIN_RAISE_AT && work == lsc_round(s, s->floor_scale))
                return LSC_FLOOR_ERROR;
            x = lsc_backoff_value(s, work);
            if ((s->flags & LSC_HAS_MIN) && x < lsc_round(s, s->min_scale))
                x = lsc_round(s, s->min_scale);
            work = x;
            overflows = 0;
            since = 0;
            if (s->flags & LSC_REFILL_BACKOFF)
                left = s->hysteresis;
        }
        if ((s->flags & LSC_HYST_SATURATE) && left < 1)
            left = 1;
        good = 0;
        if (s->min_action == LSC_MIN_RAISE_BELOW && work <= lsc_round(s, s->floor_scale)) {
            /* give up: the scale stays, the overflow is on record */
            s->good_steps = good;
            s->hysteresis_left = left;
            s->overflows = overflows;
            s->since_rescale = since;
            s->overflow_seen = seen;
            return LSC_FLOOR_ERROR;
        }
    }
    /* commit: nothing above touched *s */
    if (s->flags & LSC_APPLY_NEXT) {
        s->scale = s->next_scale;
        s->next_scale = work;
    } else {
        s->scale = work;
    }
    s->good_steps = good;
    s->hysteresis_left = left;
    s->overflows = overflows;
    s->since_rescale = since;
    s->overflow_seen = seen;
    s->steps += 1;
    s->skipped += !apply;
    return apply ? LSC_APPLY : LSC_SKIP;
}

#endif /* LSC_STATE_H */
