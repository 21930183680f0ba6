/* scan.cu: multi-tensor fused unscale + non-finite check, a read-only
 * all_finite, and the one-pass unscale + check + norm and its clip, for
 * fp16, bf16, fp32 and fp64 on the GPU.
 *
 * Design (apex's multi_tensor_apply, with the tables in device memory):
 * one launch covers many same-dtype tensors.  `table` is one device array of
 * 64-bit words laid out as
 *     [ptr_0 .. ptr_{nt-1}] [size_0 .. size_{nt-1}] [block_0 .. block_{grid-1}]
 * where block_b = tensor index (low 32 bits) | chunk index (high 32 bits):
 * block b handles elements [c*chunk, min(size, (c+1)*chunk)) of tensor t.
 * lscore.kernels.plan_launches builds the tables (and splits a long list
 * into several launches); the kernels only read them.
 *
 * The arithmetic is that of the CPU core (_ext/lsc_scan.h): the check is on
 * the input words (all-ones exponent, tested as (w & EXP) + EXP_LSB carrying
 * into the top bit), fp16/bf16 are widened to float, multiplied by
 * float(inv) and rounded back to nearest even by lsc_half.h, the CPU core's
 * own conversions (NaN becomes 0x7E00 with the sign kept for fp16, 0x7FC0
 * for bf16), fp32 multiplies by float(inv), fp64 by the double inv, and
 * inv == 1 writes nothing.
 *
 * Everything a call changes travels as kernel arguments, so a call is its
 * launches and nothing else (no upload, no reset kernel): the inverse scale
 * by value (or, with inv_dev non-null, read from device memory), and `mark`,
 * the call's number.  A thread that sees a non-finite word stores `mark`
 * to *found (a benign race: every writer stores the same value); the host
 * reads the word back once and compares it with the mark of its call, so
 * the flag is never cleared between calls.  The device-side state machine
 * (update.cu) uses mark 1 and clears the flag itself.
 *
 * The one-pass norm (lsc_mt_unscale_norm, lsc_norm_fold, lsc_norm_finish,
 * lsc_mt_clip; lscore.cuda.MultiTensor.launch_norm plans it): the unscale
 * pass also gathers, per thread, the sum of squares (L2) or the largest
 * magnitude (inf) of the values it leaves, each widened to double exactly
 * and squared and summed in double, as the CPU core does.  Every thread owns
 * one slot of a preallocated partials buffer, so no shared memory and no
 * atomics are needed and a thread's order is fixed; fold launches (one
 * thread per 64 partials, strided) and one single-thread finish reduce the
 * partials in an order fixed by the plan.  Contract: the same arrays give
 * the same bits on every call; the inf-norm is exact (it equals the CPU
 * core's); the 2-norm differs from the CPU core's 16-lane order only by
 * float64 rounding.  The finish also folds in torch's clip coefficient,
 * which lsc_mt_clip reads on the device, so a clipped step needs no host
 * round trip.
 *
 * No CUDA toolkit header is included, so NVRTC from pip compiles this file
 * with only _ext/ on the include path, and tests/helpers/cuda_host compiles the same
 * text with g++ and a shim for blockIdx/threadIdx/blockDim/gridDim and the
 * bit-cast intrinsics (sqrt from <math.h> there).  No shared memory and no
 * __syncthreads: the threads of a block are independent, so the host
 * harness may run them in any order.
 */
#include "lsc_codes.h"
#include "lsc_half.h"

#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

/* ---- dtype traits: word type, exponent mask, and the scaled value ------ */

struct lsc_f16 {
    typedef lsc_u16 word;
    static __device__ __forceinline__ lsc_u32 bad(word w)
    {
        return ((w & LSC_EXP_F16) + LSC_EXP_LSB_F16) >> 15;
    }
    static __device__ __forceinline__ word mul(word w, double inv)
    {
        return lsc_f32_to_f16(lsc_f16_to_f32(w) * (float)inv);
    }
    static __device__ __forceinline__ double val(word w)
    {
        return (double)lsc_f16_to_f32(w);
    }
};

struct lsc_bf16 {
    typedef lsc_u16 word;
    static __device__ __forceinline__ lsc_u32 bad(word w)
    {
        return ((w & LSC_EXP_BF16) + LSC_EXP_LSB_BF16) >> 15;
    }
    static __device__ __forceinline__ word mul(word w, double inv)
    {
        return lsc_f32_to_bf16(lsc_bf16_to_f32(w) * (float)inv);
    }
    static __device__ __forceinline__ double val(word w)
    {
        return (double)lsc_bf16_to_f32(w);
    }
};

struct lsc_f32 {
    typedef lsc_u32 word;
    static __device__ __forceinline__ lsc_u32 bad(word w)
    {
        return ((w & LSC_EXP_F32) + LSC_EXP_LSB_F32) >> 31;
    }
    static __device__ __forceinline__ word mul(word w, double inv)
    {
        return __float_as_uint(__uint_as_float(w) * (float)inv);
    }
    static __device__ __forceinline__ double val(word w)
    {
        return (double)__uint_as_float(w);
    }
};

struct lsc_f64 {
    typedef lsc_u64 word;
    static __device__ __forceinline__ lsc_u32 bad(word w)
    {
        return (lsc_u32)(((w & LSC_EXP_F64) + LSC_EXP_LSB_F64) >> 63);
    }
    static __device__ __forceinline__ word mul(word w, double inv)
    {
        return (lsc_u64)__double_as_longlong(__longlong_as_double((lsc_i64)w) * inv);
    }
    static __device__ __forceinline__ double val(word w)
    {
        return __longlong_as_double((lsc_i64)w);
    }
};

/* 16 bytes seen as one vector load/store or as words of the element type */
template <class W>
union lsc_vec16 {
    struct alignas(16) { lsc_u32 x, y, z, w; } v;
    W e[16 / sizeof(W)];
};

/* What a thread of the one-pass norm gathers from the values it leaves in
 * memory (after the multiply), and the partial it stores: nothing, their
 * sum of squares (L2), or their largest magnitude (inf), kept as the bits
 * of |x| in double, whose integer order is the magnitude order with NaN
 * above Inf. */
struct lsc_norm_none {
    static __device__ __forceinline__ void add(double, double *, lsc_u64 *) {}
    static __device__ __forceinline__ void store(double *, lsc_i64, double, lsc_u64) {}
};

struct lsc_norm_l2 {
    static __device__ __forceinline__ void add(double d, double *sumsq, lsc_u64 *)
    {
        *sumsq += d * d;
    }
    static __device__ __forceinline__ void store(double *part, lsc_i64 i, double sumsq, lsc_u64)
    {
        part[i] = sumsq;
    }
};

struct lsc_norm_inf {
    static __device__ __forceinline__ void add(double d, double *, lsc_u64 *maxbits)
    {
        lsc_u64 m = (lsc_u64)__double_as_longlong(d) & 0x7FFFFFFFFFFFFFFFull;
        *maxbits = m > *maxbits ? m : *maxbits;
    }
    static __device__ __forceinline__ void store(double *part, lsc_i64 i, double, lsc_u64 maxbits)
    {
        part[i] = __longlong_as_double((lsc_i64)maxbits);
    }
};

/* One block: one chunk of one tensor.  WRITE selects the fused unscale;
 * N what every thread stores to part[blockIdx.x * blockDim.x + threadIdx.x]
 * (its own slot: no shared memory, and a fixed order of its elements, so
 * the partials are the same bits run to run).  A null `found` skips the
 * check's store. */
template <class F, bool WRITE, class N = lsc_norm_none>
__device__ __forceinline__ void lsc_mt_chunk(const lsc_u64 *table, int ntensors, lsc_i64 chunk,
                                             double inv, lsc_u32 *found, lsc_u32 mark,
                                             double *part = 0)
{
    typedef typename F::word W;
    const int VEC = (int)(16 / sizeof(W));
    lsc_u64 entry = table[2 * (lsc_i64)ntensors + blockIdx.x];
    lsc_i64 t = (lsc_i64)(entry & 0xFFFFFFFFull);
    lsc_i64 lo = (lsc_i64)(entry >> 32) * chunk;
    lsc_i64 size = (lsc_i64)table[ntensors + t];
    lsc_i64 hi = size - lo < chunk ? size : lo + chunk;
    W *p = (W *)table[t];
    lsc_u32 acc = 0;
    double sumsq = 0.0;
    lsc_u64 maxbits = 0;

    /* vector part: 16-byte aligned start and a chunk made of whole vectors */
    if ((((lsc_u64)(p + lo)) & 15u) == 0 && chunk % VEC == 0) {
        lsc_i64 nvec = (hi - lo) / VEC;
        lsc_vec16<W> *q = (lsc_vec16<W> *)(p + lo);
        for (lsc_i64 i = threadIdx.x; i < nvec; i += blockDim.x) {
            lsc_vec16<W> u;
            u.v = q[i].v;
            for (int k = 0; k < VEC; k++) {
                acc |= F::bad(u.e[k]);
                if (WRITE)
                    u.e[k] = F::mul(u.e[k], inv);
                N::add(F::val(u.e[k]), &sumsq, &maxbits);
            }
            if (WRITE)
                q[i].v = u.v;
        }
        lo += nvec * VEC;
    }
    for (lsc_i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        W w = p[i];
        acc |= F::bad(w);
        if (WRITE)
            p[i] = w = F::mul(w, inv);
        N::add(F::val(w), &sumsq, &maxbits);
    }
    if (acc && found)
        *found = mark;
    N::store(part, (lsc_i64)blockIdx.x * blockDim.x + threadIdx.x, sumsq, maxbits);
}

/* Multiply every element in place by inv (by *inv_dev when that is not
 * null; float(inv) below fp64) and store `mark` to *found if any input
 * element was NaN or +/-Inf.  An inverse of 1 only checks. */
template <class F>
__global__ void lsc_mt_unscale(const lsc_u64 *table, int ntensors, lsc_i64 chunk,
                               double inv, const double *inv_dev, lsc_u32 *found,
                               lsc_u32 mark)
{
    double v = inv_dev ? *inv_dev : inv;
    if (v == 1.0)
        lsc_mt_chunk<F, false>(table, ntensors, chunk, v, found, mark);
    else
        lsc_mt_chunk<F, true>(table, ntensors, chunk, v, found, mark);
}

/* Store `mark` to *found if any element is NaN or +/-Inf.  A block starting
 * after this call's mark is there returns at once (read-only, so stopping
 * early is safe). */
template <class F>
__global__ void lsc_mt_all_finite(const lsc_u64 *table, int ntensors, lsc_i64 chunk,
                                  lsc_u32 *found, lsc_u32 mark)
{
    if (*(volatile lsc_u32 *)found == mark)
        return;
    lsc_mt_chunk<F, false>(table, ntensors, chunk, 1.0, found, mark);
}

/* ---- the one-pass norm: unscale + check + norm, then fold, then clip ---- */

/* lsc_mt_unscale, and every thread also stores the L2 (inf_norm == 0) or
 * inf partial of the values it wrote (see lsc_mt_chunk) into `part`, this
 * launch's slice of blockDim.x slots per block. */
template <class F>
__global__ void lsc_mt_unscale_norm(const lsc_u64 *table, int ntensors, lsc_i64 chunk,
                                    double inv, const double *inv_dev, lsc_u32 *found,
                                    lsc_u32 mark, double *part, int inf_norm)
{
    double v = inv_dev ? *inv_dev : inv;
    if (inf_norm) {
        if (v == 1.0)
            lsc_mt_chunk<F, false, lsc_norm_inf>(table, ntensors, chunk, v, found, mark, part);
        else
            lsc_mt_chunk<F, true, lsc_norm_inf>(table, ntensors, chunk, v, found, mark, part);
    } else {
        if (v == 1.0)
            lsc_mt_chunk<F, false, lsc_norm_l2>(table, ntensors, chunk, v, found, mark, part);
        else
            lsc_mt_chunk<F, true, lsc_norm_l2>(table, ntensors, chunk, v, found, mark, part);
    }
}

/* a + b for L2 partials; for inf partials (magnitudes) the larger, NaN winning */
__device__ __forceinline__ double lsc_norm_add(double a, double b, int inf_norm)
{
    if (!inf_norm)
        return a + b;
    return (lsc_u64)__double_as_longlong(b) > (lsc_u64)__double_as_longlong(a) ? b : a;
}

/* Thread g < nout folds in[g], in[g + nout], in[g + 2 nout], ... into
 * out[g]: one level of the reduction, in an order fixed by n and nout. */
__global__ void lsc_norm_fold(const double *in, lsc_i64 n, double *out, lsc_i64 nout,
                              int inf_norm)
{
    lsc_i64 g = (lsc_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= nout)
        return;
    double acc = 0.0;
    for (lsc_i64 i = g; i < n; i += nout)
        acc = lsc_norm_add(acc, in[i], inf_norm);
    out[g] = acc;
}

/* One thread folds in[0 .. n) in order and writes
 *     out[0] the norm (sqrt of the sum for L2), out[1] the clip coefficient,
 *     out[2] 1.0 when *found == mark (the check saw NaN/Inf), else 0.0,
 *     out[3] the folded total (sum of squares, or the largest magnitude).
 * The coefficient is torch's clip_grad_norm_'s, max_norm / (norm + 1e-6)
 * clamped to 1, taken in double; it is 1 (nothing clipped) when max_norm is
 * not > 0, when the check saw NaN/Inf or when the norm is not finite (the
 * step is skipped, so its gradients are left as they are). */
__global__ void lsc_norm_finish(const double *in, lsc_i64 n, int inf_norm, double max_norm,
                                const lsc_u32 *found, lsc_u32 mark, double *out)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    double acc = 0.0;
    for (lsc_i64 i = 0; i < n; i++)
        acc = lsc_norm_add(acc, in[i], inf_norm);
    double norm = inf_norm ? acc : sqrt(acc);
    int bad = *(volatile const lsc_u32 *)found == mark;
    double coef = 1.0;
    if (max_norm > 0.0 && !bad && norm <= 1.7976931348623157e308) {
        coef = max_norm / (norm + 1e-6);
        if (!(coef < 1.0))
            coef = 1.0;
    }
    out[0] = norm;
    out[1] = coef;
    out[2] = bad ? 1.0 : 0.0;
    out[3] = acc;
}

/* Multiply every element in place by coef (by *coef_dev when that is not
 * null; float(coef) below fp64, as lsc_mt_unscale rounds).  A coefficient
 * of 1 returns at once: nothing to clip, nothing read. */
template <class F>
__global__ void lsc_mt_clip(const lsc_u64 *table, int ntensors, lsc_i64 chunk, double coef,
                            const double *coef_dev)
{
    double v = coef_dev ? *coef_dev : coef;
    if (v == 1.0)
        return;
    lsc_mt_chunk<F, true>(table, ntensors, chunk, v, 0, 0);
}
