/* optim.cu: fused multi-tensor SGD and Adam for float32 master weights,
 * reading float16, bfloat16 or float32 gradients once: unscale in registers,
 * then update the parameter and its slots in the same pass.
 *
 * Design: scan.cu's multi-tensor launch (one block per chunk of one tensor,
 * the table [ptr_0 .. ptr_{nt-1}] [size_0 ..] [block_0 ..] built by
 * lscore.cuda.plan_launches), except that the pointer of tensor t is the
 * device address of its *record*: D 64-bit addresses
 *     SGD:  {grad, param, momentum}      (momentum unused without a slot)
 *     Adam: {grad, param, m, v}
 * so one plan of the records serves every list, and a tensor split over
 * several launches keeps its record.  Parameters and slots are float32.
 *
 * Unscaling is scan.cu's own (its traits are reused: F::mul), so a gradient
 * is rounded exactly as lscore.unscale_ / the unscale kernel would store it
 * (float16/bfloat16: widened, times float(inv), rounded back to nearest
 * even; float32: times float(inv)) and then widened to float32 exactly, as
 * the array optimizers cast a gradient to its variable's dtype.  The
 * unscaled gradient is not written back.
 *
 * Skip: the step is decided on the device before this launch (two-phase: a
 * check launch marking `gate`, or update.cu's apply flag).  When `gate` is
 * not null and *gate == skip_if, every block returns before touching memory,
 * so parameters and slots stay bit for bit unchanged.  (For a scan flag pass
 * the call's mark; for update.cu's flags[LSC_DEV_APPLY] pass 0.)  The check
 * can be these kernels themselves: with LSC_OPT_CHECK in `flags` a launch
 * only unscales every gradient in registers, exactly as the update would,
 * and stores skip_if at `gate` when one is NaN/Inf; it writes nothing else.
 * So the check sees the unscaled values the update uses (a finite scaled
 * gradient that overflows when unscaled counts), without storing them, and
 * both phases run over the same plan of records.
 *
 * LSC_OPT_INV_AS_GRAD rounds the inverse to the gradient's dtype before the
 * multiply: what the NumPy adapter's get_unscaled_gradients does (the scale
 * cast to the gradient's dtype, as TF casts it).  The inverse is a float32
 * value for the float32 policies, so float -> float16/bfloat16 is one
 * rounding.  Without the bit the inverse is float(inv), as scan.cu's.
 *
 * Adam's bias correction comes from the host (`alpha`), or, when `count`
 * is not null, from the device step counter *count (the optimizer's
 * iterations, so t = *count + 1) and host tables `bias`: sq[t] at bias[t]
 * and d[t] at bias[last + 1 + t], t capped at `last` (lscore/cuda/optim.py
 * builds them exactly as the adapter computes sqrt(1 - beta_2**t) and
 * 1 - beta_1**t, up to the step where both are 1).  A captured CUDA graph
 * then replays later steps with the right t.
 *
 * The arithmetic is tf-keras's, in float32, in the order of the NumPy
 * adapter (adapters/_arrays.py), so with NVRTC's --fmad=false (no
 * contraction), --prec-div=true and the correctly rounded sqrtf, every
 * result equals the NumPy adapter's bit for bit.  Host-side float32
 * constants (lr, momentum, Adam's alpha with its bias correction, 1 - beta,
 * epsilon) are computed by the host exactly as the adapter computes them.
 *
 * The flag bits (LSC_OPT_*) are lsc_codes.h's (lscore._ext._codes.OPTIM_FLAGS).
 *
 * Everything a schedule may change (lr, momentum, dampening, weight decay;
 * Adam's betas, epsilon and alpha) can be read through `hyper`, a device
 * float32 array, instead of by value: see lsc_mt_sgd and lsc_mt_adam.
 *
 * Like scan.cu: no toolkit header.
 */
#include "lsc_codes.h"
#include "scan.cu"

#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

/* gradient word -> float32, exact (the word is already unscaled) */
template <class F>
struct lsc_widen;

template <>
struct lsc_widen<lsc_f16> {
    static __device__ __forceinline__ float f(lsc_u16 w) { return lsc_dev_f16_to_f32(w); }
};

template <>
struct lsc_widen<lsc_bf16> {
    static __device__ __forceinline__ float f(lsc_u16 w) { return lsc_dev_bf16_to_f32(w); }
};

template <>
struct lsc_widen<lsc_f32> {
    static __device__ __forceinline__ float f(lsc_u32 w) { return __uint_as_float(w); }
};

/* unscale as scan.cu does (nothing when inv == 1), then widen */
template <class F>
__device__ __forceinline__ float lsc_grad(typename F::word w, double inv)
{
    return lsc_widen<F>::f(inv == 1.0 ? w : F::mul(w, (typename F::scale)inv));
}

/* the inverse rounded to the gradient's dtype (LSC_OPT_INV_AS_GRAD) */
template <class F>
struct lsc_inv_in;

template <>
struct lsc_inv_in<lsc_f16> {
    static __device__ __forceinline__ double f(double inv)
    {
        return lsc_dev_f16_to_f32(lsc_dev_f32_to_f16((float)inv));
    }
};

template <>
struct lsc_inv_in<lsc_bf16> {
    static __device__ __forceinline__ double f(double inv)
    {
        return lsc_dev_bf16_to_f32(lsc_dev_f32_to_bf16((float)inv));
    }
};

template <>
struct lsc_inv_in<lsc_f32> {
    static __device__ __forceinline__ double f(double inv) { return (float)inv; }
};

/* one block's work: its tensor's gradient and parameter, the rest of its
 * record (the slots), its element range and the inverse scale */
template <class F>
struct lsc_opt_block {
    const typename F::word *g;
    float *w;
    const lsc_u64 *rec;
    lsc_i64 lo, hi;
    double inv;
};

/* fill *b for this block; false: nothing to update (a skipped step, or a
 * check launch, which has done its work) */
template <class F>
__device__ __forceinline__ bool lsc_opt_enter(const lsc_u64 *table, int ntensors, lsc_i64 chunk,
                                              int flags, double inv, const double *inv_dev,
                                              lsc_u32 *gate, lsc_u32 skip_if,
                                              lsc_opt_block<F> *b)
{
    bool check = (flags & LSC_OPT_CHECK) != 0;
    if (!check && gate && *gate == skip_if)
        return false;
    lsc_u64 entry = table[2 * (lsc_i64)ntensors + blockIdx.x];
    lsc_i64 t = (lsc_i64)(entry & 0xFFFFFFFFull);
    lsc_i64 size = (lsc_i64)table[ntensors + t];
    b->lo = (lsc_i64)(entry >> 32) * chunk;
    b->hi = size - b->lo < chunk ? size : b->lo + chunk;
    b->rec = (const lsc_u64 *)table[t];
    b->g = (const typename F::word *)b->rec[0];
    b->w = (float *)b->rec[1];
    b->inv = inv_dev ? *inv_dev : inv;
    if (flags & LSC_OPT_INV_AS_GRAD)
        b->inv = lsc_inv_in<F>::f(b->inv);
    if (!check)
        return true;
    for (lsc_i64 i = b->lo + threadIdx.x; i < b->hi; i += blockDim.x) {
        if ((__float_as_uint(lsc_grad<F>(b->g[i], b->inv)) & LSC_EXP_F32) == LSC_EXP_F32) {
            *gate = skip_if;     /* every writer stores the same word */
            break;
        }
    }
    return false;
}

/* four consecutive elements as one access: 16 bytes of float32, 8 of a
 * float16/bfloat16 gradient */
template <class W>
struct alignas(4 * sizeof(W)) lsc_quad {
    W e[4];
};

template <class W>
__device__ __forceinline__ bool lsc_quad_aligned(const W *p)
{
    return ((lsc_u64)p & (4 * sizeof(W) - 1)) == 0;
}

/* decoupled weight decay, Keras's _apply_weight_decay (before the update):
 *     w = w - w * wd * lr                    (nothing when wd == 0) */
__device__ __forceinline__ float lsc_decay(float w, float wd, float lr)
{
    return wd != 0.0f ? w - w * wd * lr : w;
}

/* the SGD hyperparameters; read through `hyper` (lr, momentum, damp, wd) when not null */
struct lsc_sgd_hp {
    float lr, momentum, damp, wd;
    bool slot, nesterov, maximize;
    __device__ __forceinline__ void step(float g, float &w, float &m) const
    {
        float wi = lsc_decay(w, wd, lr);
        float st = -(maximize ? -g : g) * lr;
        if (!slot) {
            w = wi + st;
            return;
        }
        float mi = st * damp + m * momentum;
        m = mi;
        w = wi + (nesterov ? st + mi * momentum : mi);
    }
};

/* SGD, tf-keras (momentum and nesterov as adapters/_arrays.py's SGD):
 *     step = -g * lr
 *     without a slot:  w = w + step
 *     with a slot:     m = step * damp + m * momentum
 *                      w = w + (step + m * momentum)   nesterov
 *                      w = w + m                        otherwise
 * after lsc_decay; g = -g with LSC_OPT_MAXIMIZE.  damp = 1 - dampening
 * (1: tf-keras exactly, step * 1 being step).  Unlike torch's dampening there
 * is no undamped first step: that would need the host to know which step
 * was the first applied one, a sync in the sync-free mode.
 *
 * With `hyper` not null, lr, momentum, damp and wd are read from hyper[0..4)
 * (device memory) instead of the values passed: a captured graph then
 * replays with whatever was written there between replays.
 *
 * Elements move four at a time (16-byte parameter and slot accesses) when
 * every array of the block starts on a four-element boundary, the rest one
 * at a time. */
template <class F>
__global__ void lsc_mt_sgd(const lsc_u64 *table, int ntensors, lsc_i64 chunk, float lr,
                           float momentum, float damp, float wd, int flags, double inv,
                           const double *inv_dev, lsc_u32 *gate, lsc_u32 skip_if,
                           const float *hyper)
{
    typedef typename F::word W;
    lsc_opt_block<F> b;
    if (!lsc_opt_enter<F>(table, ntensors, chunk, flags, inv, inv_dev, gate, skip_if, &b))
        return;
    lsc_sgd_hp hp;
    hp.lr = hyper ? hyper[0] : lr;
    hp.momentum = hyper ? hyper[1] : momentum;
    hp.damp = hyper ? hyper[2] : damp;
    hp.wd = hyper ? hyper[3] : wd;
    hp.slot = (flags & LSC_OPT_SLOT) != 0;
    hp.nesterov = (flags & LSC_OPT_NESTEROV) != 0;
    hp.maximize = (flags & LSC_OPT_MAXIMIZE) != 0;
    lsc_i64 n = b.hi - b.lo, bs = blockDim.x;
    const W *g = b.g + b.lo;
    float *w = b.w + b.lo, *m = (float *)b.rec[2] + b.lo;
    bool quads = lsc_quad_aligned(g) && lsc_quad_aligned(w) && (!hp.slot || lsc_quad_aligned(m));
    lsc_i64 n4 = quads ? n / 4 : 0;
    for (lsc_i64 i = threadIdx.x; i < n4; i += bs) {
        lsc_quad<W> gq = ((const lsc_quad<W> *)g)[i];
        lsc_quad<float> wq = ((lsc_quad<float> *)w)[i], mq = wq;    /* mq: read with a slot */
        if (hp.slot)
            mq = ((lsc_quad<float> *)m)[i];
        for (int k = 0; k < 4; k++)
            hp.step(lsc_grad<F>(gq.e[k], b.inv), wq.e[k], mq.e[k]);
        ((lsc_quad<float> *)w)[i] = wq;
        if (hp.slot)
            ((lsc_quad<float> *)m)[i] = mq;
    }
    for (lsc_i64 i = 4 * n4 + threadIdx.x; i < n; i += bs) {
        float wi = w[i], mi = hp.slot ? m[i] : 0.0f;
        hp.step(lsc_grad<F>(g[i], b.inv), wi, mi);
        w[i] = wi;
        if (hp.slot)
            m[i] = mi;
    }
}

/* the Adam hyperparameters (alpha, c1 = 1 - beta_1, c2 = 1 - beta_2, eps, lr, wd) */
struct lsc_adam_hp {
    float alpha, c1, c2, eps, lr, wd;
    bool amsgrad, maximize;
    __device__ __forceinline__ void step(float g, float &w, float &m, float &s, float &vh) const
    {
        float wi = lsc_decay(w, wd, lr);
        if (maximize)
            g = -g;
        float mi = m + (g - m) * c1;
        float si = s + (g * g - s) * c2;
        m = mi;
        s = si;
        if (amsgrad) {
            si = vh > si ? vh : si;
            vh = si;
        }
        w = wi - (mi * alpha) / (sqrtf(si) + eps);
    }
};

/* Adam, tf-keras (adapters/_arrays.py's Adam; alpha = lr * sqrt(1 - beta_2**t)
 * / (1 - beta_1**t) from the host, c1 = 1 - beta_1, c2 = 1 - beta_2):
 *     m = m + (g - m) * c1
 *     v = v + (g * g - v) * c2
 *     w = w - (m * alpha) / (sqrt(v) + epsilon)
 * after lsc_decay (AdamW); g = -g with LSC_OPT_MAXIMIZE; with LSC_OPT_AMSGRAD
 * (Keras) vhat = max(vhat, v) and vhat replaces v in the last line.
 *
 * With `hyper` not null, lr, c1, c2, eps, wd and alpha are read from
 * hyper[0..6) (device memory) instead of the values passed; with `count`
 * as well, alpha comes from that lr and the bias tables, so a learning-rate
 * schedule written into hyper[0] between replays of a captured graph takes
 * effect.  Elements move four at a time as in lsc_mt_sgd. */
template <class F>
__global__ void lsc_mt_adam(const lsc_u64 *table, int ntensors, lsc_i64 chunk, float alpha,
                            float c1, float c2, float eps, float lr, float wd, int flags,
                            double inv, const double *inv_dev, lsc_u32 *gate, lsc_u32 skip_if,
                            const float *bias, const lsc_i64 *count, lsc_i64 last,
                            const float *hyper)
{
    typedef typename F::word W;
    lsc_opt_block<F> b;
    if (!lsc_opt_enter<F>(table, ntensors, chunk, flags, inv, inv_dev, gate, skip_if, &b))
        return;
    lsc_adam_hp hp;
    hp.lr = hyper ? hyper[0] : lr;
    hp.c1 = hyper ? hyper[1] : c1;
    hp.c2 = hyper ? hyper[2] : c2;
    hp.eps = hyper ? hyper[3] : eps;
    hp.wd = hyper ? hyper[4] : wd;
    hp.alpha = hyper ? hyper[5] : alpha;
    if (count) {
        lsc_i64 t = *count + 1;
        t = t < last ? t : last;
        hp.alpha = (hp.lr * bias[t]) / bias[last + 1 + t];    /* the adapter's order */
    }
    hp.amsgrad = (flags & LSC_OPT_AMSGRAD) != 0;
    hp.maximize = (flags & LSC_OPT_MAXIMIZE) != 0;
    lsc_i64 n = b.hi - b.lo, bs = blockDim.x;
    const W *g = b.g + b.lo;
    float *w = b.w + b.lo, *m = (float *)b.rec[2] + b.lo, *s = (float *)b.rec[3] + b.lo;
    float *vh = (float *)b.rec[hp.amsgrad ? 4 : 3] + b.lo;
    bool quads = lsc_quad_aligned(g) && lsc_quad_aligned(w) && lsc_quad_aligned(m)
              && lsc_quad_aligned(s) && lsc_quad_aligned(vh);
    lsc_i64 n4 = quads ? n / 4 : 0;
    for (lsc_i64 i = threadIdx.x; i < n4; i += bs) {
        lsc_quad<W> gq = ((const lsc_quad<W> *)g)[i];
        lsc_quad<float> wq = ((lsc_quad<float> *)w)[i], mq = ((lsc_quad<float> *)m)[i];
        lsc_quad<float> sq = ((lsc_quad<float> *)s)[i], vq = sq;    /* vq: read with amsgrad */
        if (hp.amsgrad)
            vq = ((lsc_quad<float> *)vh)[i];
        for (int k = 0; k < 4; k++)
            hp.step(lsc_grad<F>(gq.e[k], b.inv), wq.e[k], mq.e[k], sq.e[k], vq.e[k]);
        ((lsc_quad<float> *)w)[i] = wq;
        ((lsc_quad<float> *)m)[i] = mq;
        ((lsc_quad<float> *)s)[i] = sq;
        if (hp.amsgrad)
            ((lsc_quad<float> *)vh)[i] = vq;
    }
    for (lsc_i64 i = 4 * n4 + threadIdx.x; i < n; i += bs) {
        float wi = w[i], mi = m[i], si = s[i], vi = hp.amsgrad ? vh[i] : 0.0f;
        hp.step(lsc_grad<F>(g[i], b.inv), wi, mi, si, vi);
        w[i] = wi;
        m[i] = mi;
        s[i] = si;
        if (hp.amsgrad)
            vh[i] = vi;
    }
}
