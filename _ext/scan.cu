/* scan.cu: multi-tensor fused unscale + non-finite check, a read-only
 * all_finite, and the one-pass unscale + check + norm and its clip, for
 * fp16, bf16, fp32 and fp64 on the GPU.
 *
 * Design (torch's multi_tensor_apply): one launch covers many same-dtype
 * tensors, whose addresses, sizes and block-to-chunk map travel in the
 * launch's kernel arguments (lsc_meta: 4 KB, or 32 KB on CUDA >= 12.1 and
 * sm_70+); block b handles elements [c*chunk, min(size, (c+1)*chunk)) of
 * tensor t.  lscore.cuda.MultiTensor packs them (splitting a long list
 * into several launches); nothing is uploaded.
 *
 * Streaming (lsc_stream): a block's range moves in 16-byte accesses, four
 * independent ones in flight per thread (torch's ILP 4), from the first
 * 16-byte boundary on; the elements before it and the tail after the last
 * whole vector take a scalar path.  The check works on the raw words, two
 * halves or one float per 32-bit word at a time: (w & EXP) + EXP_LSB sets
 * the top bit of a field exactly when its exponent is all ones, and fields
 * never carry into each other.
 *
 * The arithmetic is that of the CPU core (_ext/lsc_scan.h): fp16/bf16 are
 * widened to float, multiplied by float(inv) and rounded back to nearest
 * even by the GPU's conversion instructions (lsc_half.h: the same finite
 * results as the CPU core's C conversion; a NaN becomes 0x7FFF, as in
 * torch's CUDA kernels), fp32 multiplies by float(inv), fp64 by the double
 * inv, and inv == 1 writes nothing.
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
 * The one-pass norm (lsc_mt_unscale_norm, then lsc_mt_clip;
 * lscore.cuda.MultiTensor.launch_norm plans it): the unscale pass also
 * gathers, per thread, the sum of squares (L2) or the largest magnitude
 * (inf) of the values it leaves, each widened to double exactly and squared
 * and summed in double, as the CPU core does.  A block reduces its threads'
 * partials with warp shuffles and shared memory in a fixed tree to one
 * partial; the last block of the launch to arrive (an atomic ticket after a
 * fence) folds the launch's partials in block order and adds the sum to the
 * call's running total, and the last launch of the call leaves the result.
 * So the buffers are one double per block of the largest launch, whatever
 * the model, and the same arrays give the same bits on every call (the
 * order depends on the sizes, the launch limits and each array's address
 * modulo 16, never on scheduling).  The inf-norm is exact (it equals the
 * CPU core's); the 2-norm differs from the CPU core's 16-lane order only by
 * float64 rounding.  The result also carries torch's clip coefficient,
 * which lsc_mt_clip reads on the device, so a clipped step needs no host
 * round trip.
 *
 * No CUDA toolkit header is included, so NVRTC from pip compiles this file
 * with only _ext/ on the include path, and tests/helpers/cuda_host compiles
 * the same text with g++ and runs a block's threads as cooperatively
 * switched contexts, so shared memory, __syncthreads and warp shuffles
 * behave there as on the device.
 */
#include "lsc_codes.h"
#include "lsc_half.h"
#include "lsc_warp.h"

#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

/* ---- dtype traits ------------------------------------------------------
 * word: the element's bits; scale: the multiplier's type (float below fp64);
 * bad: the check of one word; M/L: the check's mask and lowest exponent bit
 * on each 32-bit word of a vector (LO for the even words, HI for the odd);
 * mul: the unscaled word; val: the word's value as a double. */

struct lsc_f16 {
    typedef lsc_u16 word;
    typedef float scale;
    static const lsc_u32 M_LO = LSC_EXP_F16 * 0x10001u, L_LO = LSC_EXP_LSB_F16 * 0x10001u;
    static const lsc_u32 M_HI = M_LO, L_HI = L_LO, TOP = 0x80008000u;
    static const word ABS = 0x7FFFu;
    static __device__ __forceinline__ lsc_u32 bad(word w)
    {
        return ((w & LSC_EXP_F16) + LSC_EXP_LSB_F16) >> 15;
    }
    static __device__ __forceinline__ word mul(word w, scale inv)
    {
        return lsc_dev_f32_to_f16(lsc_dev_f16_to_f32(w) * inv);
    }
    static __device__ __forceinline__ double val(word w)
    {
        return lsc_dev_f16_to_f64(w);
    }
};

struct lsc_bf16 {
    typedef lsc_u16 word;
    typedef float scale;
    static const lsc_u32 M_LO = LSC_EXP_BF16 * 0x10001u, L_LO = LSC_EXP_LSB_BF16 * 0x10001u;
    static const lsc_u32 M_HI = M_LO, L_HI = L_LO, TOP = 0x80008000u;
    static const word ABS = 0x7FFFu;
    static __device__ __forceinline__ lsc_u32 bad(word w)
    {
        return ((w & LSC_EXP_BF16) + LSC_EXP_LSB_BF16) >> 15;
    }
    static __device__ __forceinline__ word mul(word w, scale inv)
    {
        return lsc_dev_f32_to_bf16(lsc_dev_bf16_to_f32(w) * inv);
    }
    static __device__ __forceinline__ double val(word w)
    {
        return lsc_dev_bf16_to_f64(w);
    }
};

struct lsc_f32 {
    typedef lsc_u32 word;
    typedef float scale;
    static const lsc_u32 M_LO = LSC_EXP_F32, L_LO = LSC_EXP_LSB_F32;
    static const lsc_u32 M_HI = M_LO, L_HI = L_LO, TOP = 0x80000000u;
    static const word ABS = 0x7FFFFFFFu;
    static __device__ __forceinline__ lsc_u32 bad(word w)
    {
        return ((w & LSC_EXP_F32) + LSC_EXP_LSB_F32) >> 31;
    }
    static __device__ __forceinline__ word mul(word w, scale inv)
    {
        return lsc_f32_bits(lsc_f32_from_bits(w) * inv);
    }
    static __device__ __forceinline__ double val(word w)
    {
        return (double)__uint_as_float(w);
    }
};

struct lsc_f64 {
    typedef lsc_u64 word;
    typedef double scale;
    /* the exponent sits in the high (odd, little-endian) 32-bit word */
    static const lsc_u32 M_LO = 0u, L_LO = 0u;
    static const lsc_u32 M_HI = (lsc_u32)(LSC_EXP_F64 >> 32);
    static const lsc_u32 L_HI = (lsc_u32)(LSC_EXP_LSB_F64 >> 32), TOP = 0x80000000u;
    static const word ABS = 0x7FFFFFFFFFFFFFFFull;
    static __device__ __forceinline__ lsc_u32 bad(word w)
    {
        return (lsc_u32)(((w & LSC_EXP_F64) + LSC_EXP_LSB_F64) >> 63);
    }
    static __device__ __forceinline__ word mul(word w, scale inv)
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

/* the check of a whole vector: nonzero in F::TOP exactly when a word is NaN/Inf */
template <class F, class V>
__device__ __forceinline__ lsc_u32 lsc_check16(const V &u)
{
    return ((u.v.x & F::M_LO) + F::L_LO) | ((u.v.y & F::M_HI) + F::L_HI)
         | ((u.v.z & F::M_LO) + F::L_LO) | ((u.v.w & F::M_HI) + F::L_HI);
}

/* What a thread of the one-pass norm gathers from the words it leaves in
 * memory (after the multiply): nothing, the sum of their squares (each
 * value widened to double exactly, squared and summed in double: L2), or
 * their largest magnitude (inf), kept as the element's own bits with the
 * sign cleared, whose integer order is the magnitude order with NaN above
 * Inf (widening is exact and monotonic, so the largest word widens to the
 * largest value).  result(): the gathered value as a double (for inf, the
 * magnitude bits of that double: an integer max orders them the same way). */
template <class F>
struct lsc_norm_none {
    static const bool ON = false;
    __device__ __forceinline__ void add(typename F::word) {}
    __device__ __forceinline__ double result() const { return 0.0; }
};

template <class F>
struct lsc_norm_l2 {
    static const bool ON = true;
    double acc;
    __device__ __forceinline__ lsc_norm_l2() : acc(0.0) {}
    __device__ __forceinline__ void add(typename F::word w)
    {
        double d = F::val(w);
        acc += d * d;
    }
    __device__ __forceinline__ double result() const { return acc; }
};

template <class F>
struct lsc_norm_inf {
    static const bool ON = true;
    typename F::word mag;
    __device__ __forceinline__ lsc_norm_inf() : mag(0) {}
    __device__ __forceinline__ void add(typename F::word w)
    {
        typename F::word m = w & F::ABS;
        mag = m > mag ? m : mag;
    }
    __device__ __forceinline__ double result() const { return F::val(mag); }
};

/* one vector: check, multiply (WRITE), gather */
template <class F, bool WRITE, class N, class V>
__device__ __forceinline__ void lsc_vec_op(V &u, typename F::scale inv, lsc_u32 &acc, N &nrm)
{
    acc |= lsc_check16<F>(u);
    for (int k = 0; k < (int)(16 / sizeof(typename F::word)); k++) {
        if (WRITE)
            u.e[k] = F::mul(u.e[k], inv);
        if (N::ON)
            nrm.add(u.e[k]);
    }
}

/* Check, unscale (WRITE) and gather over p[0 .. n) with the threads of a
 * block: a scalar head up to the first 16-byte boundary, 16-byte vectors
 * four at a time per thread, then one at a time, then a scalar tail.
 * Returns the check's bits (nonzero: a NaN/Inf word). */
template <class F, bool WRITE, class N>
__device__ __forceinline__ lsc_u32 lsc_stream(typename F::word *p, lsc_i64 n,
                                              typename F::scale inv, N &nrm)
{
    typedef typename F::word W;
    typedef lsc_vec16<W> V;
    const lsc_i64 VEC = (lsc_i64)(16 / sizeof(W));
    const lsc_i64 bs = blockDim.x, tid = threadIdx.x;
    lsc_u32 acc = 0, one = 0;
    lsc_u64 addr = (lsc_u64)p;
    lsc_i64 head = n;
    if (addr % sizeof(W) == 0) {
        head = (lsc_i64)(((16u - (addr & 15u)) & 15u) / sizeof(W));
        head = head < n ? head : n;
    }
    lsc_i64 nvec = (n - head) / VEC, rest = head + nvec * VEC;
    V *q = (V *)(p + head);
    /* The read-only float64 check needs only the high words, and ptxas would
     * narrow each 16-byte load to two 4-byte ones; `keep` is 0 for every real
     * size (below 2**62) but not known to be, so the low words stay read. */
    const bool KEEP = !WRITE && !N::ON && sizeof(W) == 8;
    const lsc_u32 keep = (lsc_u32)(n >> 62);
    lsc_i64 i = tid;
    for (; i + 3 * bs < nvec; i += 4 * bs) {
        V u0, u1, u2, u3;
        u0.v = q[i].v;
        u1.v = q[i + bs].v;
        u2.v = q[i + 2 * bs].v;
        u3.v = q[i + 3 * bs].v;
        if (KEEP)
            acc |= (u0.v.x | u0.v.z | u1.v.x | u1.v.z | u2.v.x | u2.v.z | u3.v.x | u3.v.z) & keep;
        lsc_vec_op<F, WRITE>(u0, inv, acc, nrm);
        lsc_vec_op<F, WRITE>(u1, inv, acc, nrm);
        lsc_vec_op<F, WRITE>(u2, inv, acc, nrm);
        lsc_vec_op<F, WRITE>(u3, inv, acc, nrm);
        if (WRITE) {
            q[i].v = u0.v;
            q[i + bs].v = u1.v;
            q[i + 2 * bs].v = u2.v;
            q[i + 3 * bs].v = u3.v;
        }
    }
    for (; i < nvec; i += bs) {
        V u;
        u.v = q[i].v;
        if (KEEP)
            acc |= (u.v.x | u.v.z) & keep;
        lsc_vec_op<F, WRITE>(u, inv, acc, nrm);
        if (WRITE)
            q[i].v = u.v;
    }
    /* the scalar head and tail: element j of either, one per thread */
    for (lsc_i64 j = tid; j < head + (n - rest); j += bs) {
        lsc_i64 k = j < head ? j : rest + (j - head);
        W w = p[k];
        one |= F::bad(w);
        if (WRITE)
            p[k] = w = F::mul(w, inv);
        if (N::ON)
            nrm.add(w);
    }
    return (acc & F::TOP) | one;
}

/* This block's tensor and element range, from the launch's kernel
 * argument: one lsc_meta (lsc_codes.h's capacities) passed by value, as
 * torch's multi_tensor_apply passes its TensorListMetadata, so a launch over
 * arrays never seen before needs no upload and no device table, and a
 * block finds its work in constant memory (two independent reads). */
template <int NT, int NB>
struct lsc_meta {
    lsc_u64 ptr[NT];        /* the tensors' addresses */
    lsc_i64 size[NT];       /* their element counts */
    lsc_i32 chunk_of[NB];   /* block b: chunk chunk_of[b] of tensor tensor_of[b] */
    lsc_u16 tensor_of[NB];
};
typedef lsc_meta<LSC_META_4K_TENSORS, LSC_META_4K_BLOCKS> lsc_meta_4k;
typedef lsc_meta<LSC_META_32K_TENSORS, LSC_META_32K_BLOCKS> lsc_meta_32k;

template <class W>
struct lsc_range {
    W *p;
    lsc_i64 n;
};

template <class W, class M>
__device__ __forceinline__ lsc_range<W> lsc_block_range(const M &meta, lsc_i64 chunk)
{
    lsc_i64 t = meta.tensor_of[blockIdx.x];
    lsc_i64 lo = (lsc_i64)meta.chunk_of[blockIdx.x] * chunk;
    lsc_i64 size = meta.size[t];
    lsc_range<W> r;
    r.p = (W *)meta.ptr[t] + lo;
    r.n = size - lo < chunk ? size - lo : chunk;
    return r;
}

/* one block: one chunk of one tensor; a null `found` skips the check's store */
template <class F, bool WRITE, class M, class N>
__device__ __forceinline__ void lsc_mt_chunk(const M &meta, lsc_i64 chunk, typename F::scale inv,
                                             lsc_u32 *found, lsc_u32 mark, N &nrm)
{
    lsc_range<typename F::word> r = lsc_block_range<typename F::word>(meta, chunk);
    lsc_u32 acc = lsc_stream<F, WRITE>(r.p, r.n, inv, nrm);
    if (acc && found)
        *found = mark;
}

/* Multiply every element in place by inv (by *inv_dev when that is not
 * null; float(inv) below fp64) and store `mark` to *found if any input
 * element was NaN or +/-Inf.  An inverse of 1 only checks. */
template <class F, class M>
__global__ void lsc_mt_unscale(const __grid_constant__ M meta, lsc_i64 chunk,
                               double inv, const double *inv_dev, lsc_u32 *found,
                               lsc_u32 mark)
{
    double v = inv_dev ? *inv_dev : inv;
    lsc_norm_none<F> none;
    if (v == 1.0)
        lsc_mt_chunk<F, false>(meta, chunk, (typename F::scale)v, found, mark, none);
    else
        lsc_mt_chunk<F, true>(meta, chunk, (typename F::scale)v, found, mark, none);
}

/* Store `mark` to *found if any element is NaN or +/-Inf.  A block starting
 * after this call's mark is there returns at once (read-only, so stopping
 * early is safe). */
template <class F, class M>
__global__ void lsc_mt_all_finite(const __grid_constant__ M meta, lsc_i64 chunk,
                                  lsc_u32 *found, lsc_u32 mark)
{
    if (*(volatile lsc_u32 *)found == mark)
        return;
    lsc_norm_none<F> none;
    lsc_mt_chunk<F, false>(meta, chunk, (typename F::scale)1, found, mark, none);
}

/* ---- the one-pass norm: unscale + check + norm, then clip ---------------- */

/* a + b for L2 partials; for inf partials (magnitudes) the larger, NaN winning */
__device__ __forceinline__ double lsc_norm_add(double a, double b, int inf_norm)
{
    if (!inf_norm)
        return a + b;
    return (lsc_u64)__double_as_longlong(b) > (lsc_u64)__double_as_longlong(a) ? b : a;
}

/* The block's threads' values folded into one, valid in thread 0: within
 * each warp a shuffle tree (lane l takes lane l + 16, 8, 4, 2, 1), then warp
 * 0 folds the warps' results the same way.  A fixed order, so the same bits
 * every call.  Blocks need not be whole warps (the host harness runs odd
 * sizes): a lane adds only partners that exist.  `shm` holds 32 doubles. */
__device__ __forceinline__ double lsc_block_fold(double v, int inf_norm, double *shm)
{
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    unsigned nwarps = (blockDim.x + 31u) >> 5, mask;
    unsigned live = lsc_warp_live(&mask);
    for (unsigned off = 16; off > 0; off >>= 1) {
        double o = __shfl_down_sync(mask, v, off);
        if (lane + off < live)
            v = lsc_norm_add(v, o, inf_norm);
    }
    if (lane == 0)
        shm[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? shm[lane] : 0.0;
        for (unsigned off = 16; off > 0; off >>= 1) {
            double o = __shfl_down_sync(mask, v, off);
            if (lane + off < live)
                v = lsc_norm_add(v, o, inf_norm);
        }
    }
    __syncthreads();    /* shm may be reused */
    return v;
}

/* The end of a norm launch: the block's partial to part[blockIdx.x]; the
 * last block to arrive folds part[0 .. grid) in order into the call's
 * running total state[0] (LSC_NORM_FIRST: the total starts here), and in
 * the call's last launch (LSC_NORM_LAST) writes
 *     state[1] the norm (sqrt of the total for L2), state[2] the clip
 *     coefficient, state[3] 1.0 when *found == mark (the check saw NaN/Inf)
 *     else 0.0, state[4] the total (sum of squares, or the largest magnitude).
 * The coefficient is torch's clip_grad_norm_'s, max_norm / (norm + 1e-6)
 * clamped to 1, taken in double; it is 1 (nothing clipped) when max_norm is
 * not > 0, when the check saw NaN/Inf or when the norm is not finite (the
 * step is skipped, so its gradients are left as they are).  *ticket counts
 * arrivals and is 0 again after every launch. */
__device__ __forceinline__ void lsc_norm_end(double v, int nflags, double max_norm,
                                             const lsc_u32 *found, lsc_u32 mark, double *part,
                                             double *state, lsc_u32 *ticket)
{
    __shared__ double shm[32];
    __shared__ lsc_u32 last_block;
    int inf_norm = nflags & LSC_NORM_INF;
    v = lsc_block_fold(v, inf_norm, shm);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = v;
        __threadfence();    /* the partial is visible before the ticket counts it */
        last_block = atomicAdd(ticket, 1u) == gridDim.x - 1u;
    }
    __syncthreads();
    if (!last_block)
        return;
    __threadfence();
    double s = 0.0;
    for (lsc_i64 i = threadIdx.x; i < (lsc_i64)gridDim.x; i += blockDim.x)
        s = lsc_norm_add(s, ((volatile double *)part)[i], inf_norm);
    s = lsc_block_fold(s, inf_norm, shm);
    if (threadIdx.x != 0)
        return;
    *ticket = 0u;
    double acc = (nflags & LSC_NORM_FIRST) ? s : lsc_norm_add(state[0], s, inf_norm);
    state[0] = acc;
    if (!(nflags & LSC_NORM_LAST))
        return;
    double norm = inf_norm ? acc : sqrt(acc);
    int bad = *(volatile const lsc_u32 *)found == mark;
    double coef = 1.0;
    if (max_norm > 0.0 && !bad && norm <= 1.7976931348623157e308) {
        coef = max_norm / (norm + 1e-6);
        if (!(coef < 1.0))
            coef = 1.0;
    }
    state[1] = norm;
    state[2] = coef;
    state[3] = bad ? 1.0 : 0.0;
    state[4] = acc;
}

template <class F, bool WRITE, class N, class M>
__device__ __forceinline__ void lsc_norm_chunk(const M &meta, lsc_i64 chunk,
                                               double inv, lsc_u32 *found, lsc_u32 mark,
                                               int nflags, double max_norm, double *part,
                                               double *state, lsc_u32 *ticket)
{
    N nrm;
    lsc_mt_chunk<F, WRITE>(meta, chunk, (typename F::scale)inv, found, mark, nrm);
    double v = nrm.result();
    if (nflags & LSC_NORM_INF)    /* magnitude bits: the sign of a NaN's widening cleared */
        v = __longlong_as_double(__double_as_longlong(v) & 0x7FFFFFFFFFFFFFFFll);
    lsc_norm_end(v, nflags, max_norm, found, mark, part, state, ticket);
}

/* lsc_mt_unscale, and the L2 (no LSC_NORM_INF in nflags) or inf norm of the
 * values it wrote, reduced as lsc_norm_end says. */
template <class F, class M>
__global__ void lsc_mt_unscale_norm(const __grid_constant__ M meta, lsc_i64 chunk,
                                    double inv, const double *inv_dev, lsc_u32 *found,
                                    lsc_u32 mark, int nflags, double max_norm, double *part,
                                    double *state, lsc_u32 *ticket)
{
    double v = inv_dev ? *inv_dev : inv;
    if (nflags & LSC_NORM_INF) {
        if (v == 1.0)
            lsc_norm_chunk<F, false, lsc_norm_inf<F> >(meta, chunk, v, found, mark,
                                                   nflags, max_norm, part, state, ticket);
        else
            lsc_norm_chunk<F, true, lsc_norm_inf<F> >(meta, chunk, v, found, mark,
                                                  nflags, max_norm, part, state, ticket);
    } else {
        if (v == 1.0)
            lsc_norm_chunk<F, false, lsc_norm_l2<F> >(meta, chunk, v, found, mark,
                                                  nflags, max_norm, part, state, ticket);
        else
            lsc_norm_chunk<F, true, lsc_norm_l2<F> >(meta, chunk, v, found, mark,
                                                 nflags, max_norm, part, state, ticket);
    }
}

/* Multiply every element in place by coef (by *coef_dev when that is not
 * null; float(coef) below fp64, as lsc_mt_unscale rounds).  A coefficient
 * of 1 returns at once: nothing to clip, nothing read. */
template <class F, class M>
__global__ void lsc_mt_clip(const __grid_constant__ M meta, lsc_i64 chunk, double coef,
                            const double *coef_dev)
{
    double v = coef_dev ? *coef_dev : coef;
    if (v == 1.0)
        return;
    lsc_norm_none<F> none;
    lsc_mt_chunk<F, true>(meta, chunk, (typename F::scale)v, 0, 0, none);
}
