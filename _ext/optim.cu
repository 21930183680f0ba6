/* optim.cu: fused multi-tensor SGD and Adam for float32 master weights,
 * reading float16, bfloat16 or float32 gradients once: unscale in registers,
 * then update the parameter and its slots in the same pass.
 *
 * Design: scan.cu's multi-tensor launch (one block per chunk of one tensor,
 * the tensors in the launch's kernel argument, lscore.cuda.optim's
 * FusedLauncher splitting long lists over launches), except that a tensor
 * is a *record* of D addresses (lsc_opt_meta):
 *     SGD:  {grad, param, momentum}          (momentum unused without a slot)
 *     Adam: {grad, param, m, v, vhat}        (vhat unused without amsgrad)
 * so a step over arrays never seen before needs no upload, no device table
 * and no synchronisation.  Parameters and slots are float32.  The options
 * that decide which arrays a step reads and writes (SGD's slot and
 * nesterov, Adam's amsgrad) are template variants, so each variant's loop
 * has no branch on them; the check is a kernel of its own.
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
 * can be lsc_mt_opt_check over the same argument structs: it unscales every
 * gradient in registers, exactly as the update would, and stores skip_if at
 * `gate` when one is NaN/Inf; it writes nothing else.  So the check sees
 * the unscaled values the update uses (a finite scaled gradient that
 * overflows when unscaled counts), without storing them, and both phases
 * run over the same packed records.
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

/* the inverse a launch unscales by: `inv`, or *inv_dev when that is not
 * null, rounded to the gradient's dtype under LSC_OPT_INV_AS_GRAD */
template <class F>
__device__ __forceinline__ double lsc_opt_inv(int flags, double inv, const double *inv_dev)
{
    double v = inv_dev ? *inv_dev : inv;
    return (flags & LSC_OPT_INV_AS_GRAD) ? lsc_inv_in<F>::f(v) : v;
}

/* One launch's tensors, passed by value as scan.cu's lsc_meta is: D
 * addresses per tensor (ptr[k][t]: address k of tensor t's record, the
 * layout of torch's addresses[depth][]), its element count, and the
 * block-to-chunk map.  Capacities: lsc_codes.h (torch's figures for these
 * depths, 4 KB or 32 KB of parameters). */
template <int DEPTH, int NT, int NB>
struct lsc_opt_meta {
    static const int D = DEPTH;
    lsc_u64 ptr[DEPTH][NT];
    lsc_i64 size[NT];
    lsc_i32 chunk_of[NB];
    lsc_u16 tensor_of[NB];
};
typedef lsc_opt_meta<LSC_SGD_DEPTH, LSC_SGD_4K_TENSORS, LSC_META_4K_BLOCKS> lsc_sgd_meta_4k;
typedef lsc_opt_meta<LSC_SGD_DEPTH, LSC_SGD_32K_TENSORS, LSC_META_32K_BLOCKS> lsc_sgd_meta_32k;
typedef lsc_opt_meta<LSC_ADAM_DEPTH, LSC_ADAM_4K_TENSORS, LSC_META_4K_BLOCKS> lsc_adam_meta_4k;
typedef lsc_opt_meta<LSC_ADAM_DEPTH, LSC_ADAM_32K_TENSORS, LSC_META_32K_BLOCKS>
    lsc_adam_meta_32k;

/* this block's chunk: its record's addresses moved to the chunk's first
 * element (the gradient's width at 0, float32 after) and its length */
template <int D>
struct lsc_opt_chunk {
    lsc_u64 p[D];
    lsc_i64 n;
};

/* read once, before any loop: a handful of independent reads of the
 * kernel argument, held in registers for the whole block */
template <class F, class M>
__device__ __forceinline__ lsc_opt_chunk<M::D> lsc_opt_range(const M &meta, lsc_i64 chunk)
{
    lsc_i64 t = meta.tensor_of[blockIdx.x];
    lsc_i64 lo = (lsc_i64)meta.chunk_of[blockIdx.x] * chunk;
    lsc_i64 size = meta.size[t];
    lsc_opt_chunk<M::D> c;
    c.n = size - lo < chunk ? size - lo : chunk;
    c.p[0] = meta.ptr[0][t] + (lsc_u64)lo * sizeof(typename F::word);
    for (int k = 1; k < M::D; k++)
        c.p[k] = meta.ptr[k][t] + (lsc_u64)lo * sizeof(float);
    return c;
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

/* The update loop: the gradient at p[0] and A float32 arrays at p[1 .. A]
 * (the parameter, then the slots a step reads and writes), hp.step(g, x)
 * on each element.  Four elements at a time (16-byte float32 accesses)
 * when every array starts on a four-element boundary, the rest one at a
 * time.  The step type fixes A and every option that changes which arrays
 * move, and UNIT (an inverse of 1: no multiply) and DECAY (weight decay
 * not 0) are template arguments, so a loop holds no branch on an option. */
template <class F, int A, bool UNIT, bool DECAY, class S>
__device__ __forceinline__ void lsc_opt_stream(const lsc_u64 *p, lsc_i64 n, double inv,
                                               const S &hp)
{
    typedef typename F::word W;
    const typename F::scale s = (typename F::scale)inv;
    const W *g = (const W *)p[0];
    float *x[A];
    bool quads = lsc_quad_aligned(g);
    for (int k = 0; k < A; k++) {
        x[k] = (float *)p[1 + k];
        quads = quads && lsc_quad_aligned(x[k]);
    }
    const lsc_i64 bs = blockDim.x, n4 = quads ? n / 4 : 0;
    for (lsc_i64 i = threadIdx.x; i < n4; i += bs) {
        lsc_quad<W> gq = ((const lsc_quad<W> *)g)[i];
        lsc_quad<float> xq[A];
        for (int k = 0; k < A; k++)
            xq[k] = ((const lsc_quad<float> *)x[k])[i];
        for (int e = 0; e < 4; e++) {
            float v[A];
            for (int k = 0; k < A; k++)
                v[k] = xq[k].e[e];
            hp.template step<DECAY>(lsc_widen<F>::f(UNIT ? gq.e[e] : F::mul(gq.e[e], s)), v);
            for (int k = 0; k < A; k++)
                xq[k].e[e] = v[k];
        }
        for (int k = 0; k < A; k++)
            ((lsc_quad<float> *)x[k])[i] = xq[k];
    }
    for (lsc_i64 i = 4 * n4 + threadIdx.x; i < n; i += bs) {
        float v[A];
        for (int k = 0; k < A; k++)
            v[k] = x[k][i];
        hp.template step<DECAY>(lsc_widen<F>::f(UNIT ? g[i] : F::mul(g[i], s)), v);
        for (int k = 0; k < A; k++)
            x[k][i] = v[k];
    }
}

/* lsc_opt_stream for this block's inverse (unscaled as scan.cu does: no
 * multiply when it is 1) and weight decay: four loops, one runs */
template <class F, int A, class S>
__device__ __forceinline__ void lsc_opt_run(const lsc_u64 *p, lsc_i64 n, double inv,
                                            const S &hp)
{
    if (inv == 1.0) {
        if (hp.wd != 0.0f)
            lsc_opt_stream<F, A, true, true>(p, n, inv, hp);
        else
            lsc_opt_stream<F, A, true, false>(p, n, inv, hp);
    } else {
        if (hp.wd != 0.0f)
            lsc_opt_stream<F, A, false, true>(p, n, inv, hp);
        else
            lsc_opt_stream<F, A, false, false>(p, n, inv, hp);
    }
}

/* g, or -g under LSC_OPT_MAXIMIZE (`sign` 0x80000000): a sign flip as an
 * integer operation, so maximize is no branch in the loop */
__device__ __forceinline__ float lsc_flip(float g, lsc_u32 sign)
{
    return __uint_as_float(__float_as_uint(g) ^ sign);
}

__device__ __forceinline__ lsc_u32 lsc_sign_of(int flags)
{
    return (flags & LSC_OPT_MAXIMIZE) ? 0x80000000u : 0u;
}

/* decoupled weight decay, Keras's _apply_weight_decay (before the update):
 *     w = w - w * wd * lr                    (nothing when wd == 0: DECAY false) */
template <bool DECAY>
__device__ __forceinline__ float lsc_decay(float w, float wd, float lr)
{
    return DECAY ? w - w * wd * lr : w;
}

/* The SGD step of variant V (LSC_OPT_SLOT, optionally | LSC_OPT_NESTEROV,
 * or 0): x = {w} without a slot, {w, m} with one. */
template <int V>
struct lsc_sgd_hp {
    static const int A = (V & LSC_OPT_SLOT) ? 2 : 1;
    float lr, momentum, damp, wd;
    lsc_u32 sign;
    template <bool DECAY>
    __device__ __forceinline__ void step(float g, float (&x)[A]) const
    {
        float wi = lsc_decay<DECAY>(x[0], wd, lr);
        float st = -lsc_flip(g, sign) * lr;
        if (!(V & LSC_OPT_SLOT)) {
            x[0] = wi + st;
            return;
        }
        float mi = st * damp + x[A - 1] * momentum;
        x[A - 1] = mi;
        x[0] = wi + ((V & LSC_OPT_NESTEROV) ? st + mi * momentum : mi);
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
 * V, the variant, is the host's LSC_OPT_SLOT | LSC_OPT_NESTEROV bits (the
 * same bits in `flags` are not read).  With `hyper` not null, lr,
 * momentum, damp and wd are read from hyper[0..4) (device memory) instead
 * of the values passed: a captured graph then replays with whatever was
 * written there between replays.  The record is {grad, param, momentum}. */
template <class F, class M, int V>
__global__ void lsc_mt_sgd(const __grid_constant__ M meta, lsc_i64 chunk, float lr,
                           float momentum, float damp, float wd, int flags, double inv,
                           const double *inv_dev, lsc_u32 *gate, lsc_u32 skip_if,
                           const float *hyper)
{
    if (gate && *gate == skip_if)
        return;
    lsc_opt_chunk<M::D> c = lsc_opt_range<F>(meta, chunk);
    lsc_sgd_hp<V> hp;
    hp.lr = hyper ? hyper[0] : lr;
    hp.momentum = hyper ? hyper[1] : momentum;
    hp.damp = hyper ? hyper[2] : damp;
    hp.wd = hyper ? hyper[3] : wd;
    hp.sign = lsc_sign_of(flags);
    lsc_opt_run<F, lsc_sgd_hp<V>::A>(c.p, c.n, lsc_opt_inv<F>(flags, inv, inv_dev), hp);
}

/* The Adam step of variant V (LSC_OPT_AMSGRAD or 0): x = {w, m, v}, and
 * vhat after them with amsgrad. */
template <int V>
struct lsc_adam_hp {
    static const int A = (V & LSC_OPT_AMSGRAD) ? 4 : 3;
    float alpha, c1, c2, eps, lr, wd;
    lsc_u32 sign;
    template <bool DECAY>
    __device__ __forceinline__ void step(float g, float (&x)[A]) const
    {
        float wi = lsc_decay<DECAY>(x[0], wd, lr);
        g = lsc_flip(g, sign);
        float mi = x[1] + (g - x[1]) * c1;
        float si = x[2] + (g * g - x[2]) * c2;
        x[1] = mi;
        x[2] = si;
        if (V & LSC_OPT_AMSGRAD) {
            si = x[A - 1] > si ? x[A - 1] : si;
            x[A - 1] = si;
        }
        x[0] = wi - (mi * alpha) / (sqrtf(si) + eps);
    }
};

/* Adam, tf-keras (adapters/_arrays.py's Adam; alpha = lr * sqrt(1 - beta_2**t)
 * / (1 - beta_1**t) from the host, c1 = 1 - beta_1, c2 = 1 - beta_2):
 *     m = m + (g - m) * c1
 *     v = v + (g * g - v) * c2
 *     w = w - (m * alpha) / (sqrt(v) + epsilon)
 * after lsc_decay (AdamW); g = -g with LSC_OPT_MAXIMIZE; in the amsgrad
 * variant (V = LSC_OPT_AMSGRAD, Keras's) vhat = max(vhat, v) and vhat
 * replaces v in the last line.  The record is {grad, param, m, v, vhat}.
 *
 * With `hyper` not null, lr, c1, c2, eps, wd and alpha are read from
 * hyper[0..6) (device memory) instead of the values passed; with `count`
 * as well, alpha comes from that lr and the bias tables, so a learning-rate
 * schedule written into hyper[0] between replays of a captured graph takes
 * effect. */
template <class F, class M, int V>
__global__ void lsc_mt_adam(const __grid_constant__ M meta, lsc_i64 chunk, float alpha,
                            float c1, float c2, float eps, float lr, float wd, int flags,
                            double inv, const double *inv_dev, lsc_u32 *gate, lsc_u32 skip_if,
                            const float *bias, const lsc_i64 *count, lsc_i64 last,
                            const float *hyper)
{
    if (gate && *gate == skip_if)
        return;
    lsc_opt_chunk<M::D> c = lsc_opt_range<F>(meta, chunk);
    lsc_adam_hp<V> hp;
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
    hp.sign = lsc_sign_of(flags);
    lsc_opt_run<F, lsc_adam_hp<V>::A>(c.p, c.n, lsc_opt_inv<F>(flags, inv, inv_dev), hp);
}

/* the largest float32 that the gradient's dtype rounds to a finite value
 * (to nearest even: 65520, half an ulp above float16's largest, rounds up
 * to Inf, as does bfloat16's largest plus half an ulp) */
template <class F>
struct lsc_finite_max;

template <>
struct lsc_finite_max<lsc_f16> {
    static __device__ __forceinline__ float f() { return 0x1.ffdffep15f; }
};

template <>
struct lsc_finite_max<lsc_bf16> {
    static __device__ __forceinline__ float f() { return 0x1.fefffep127f; }
};

template <>
struct lsc_finite_max<lsc_f32> {
    static __device__ __forceinline__ float f() { return 0x1.fffffep127f; }
};

/* What the check gathers from every gradient word scan.cu's lsc_stream
 * reads: the largest magnitude, widened to float32 (a NaN is left out here:
 * the loop's own check of the raw words sees it). */
template <class F>
struct lsc_opt_seen {
    static const bool ON = true;
    float mag;
    __device__ __forceinline__ void add(typename F::word w)
    {
        mag = fmaxf(mag, fabsf(lsc_widen<F>::f(w)));
    }
};

/* The check launch (LSC_OPT_CHECK on the host): store skip_if at *gate
 * when a gradient of this launch is NaN/Inf once unscaled as the update
 * unscales it (lsc_opt_inv's inverse; a finite float16 gradient times an
 * inverse above 1 can overflow), writing nothing else.  The gradients move
 * through scan.cu's streaming loop (16-byte loads, four in flight), which
 * checks the raw words (a raw NaN/Inf stays one after the multiply) and
 * gathers the largest magnitude.  The update rounds g * inv to the
 * gradient's dtype, which is NaN/Inf exactly when the float32 product is
 * NaN or above lsc_finite_max; rounding is monotonic, so the largest
 * product is the product of the largest magnitude: one multiply and one
 * comparison per thread.  Read-only, so a block finding skip_if already
 * stored returns at once.  Any argument struct of the fused optimizers:
 * the check reads only the gradients (ptr[0]). */
template <class F, class M>
__global__ void lsc_mt_opt_check(const __grid_constant__ M meta, lsc_i64 chunk, int flags,
                                 double inv, const double *inv_dev, lsc_u32 *gate,
                                 lsc_u32 skip_if)
{
    if (*(volatile lsc_u32 *)gate == skip_if)
        return;
    lsc_opt_chunk<M::D> c = lsc_opt_range<F>(meta, chunk);
    float v = fabsf((float)lsc_opt_inv<F>(flags, inv, inv_dev));
    lsc_opt_seen<F> seen;
    seen.mag = 0.0f;
    lsc_u32 raw = lsc_stream<F, false>((typename F::word *)c.p[0], c.n, v, seen);
    if (raw || !(seen.mag * v <= lsc_finite_max<F>::f()))
        *gate = skip_if;
}
