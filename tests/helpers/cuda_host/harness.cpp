/* harness.cpp: runs lscore's CUDA kernels on the CPU, for tests only.
 *
 * The threads of a block run as ucontext contexts on their own stacks,
 * switched cooperatively: a thread runs until __syncthreads, a warp shuffle
 * or its end, and the scheduler resumes a waiting thread only when every
 * live thread of its block has passed as many barriers and every live lane
 * of its warp as many shuffles (a shuffle's value is read from the partner's
 * slot for that shuffle: two slots per lane, by parity).  Blocks run one
 * after another.
 *
 * The text of the .cu files in _ext/ that the GPU path hands to NVRTC is compiled here with
 * g++ and cuda_shim.h.  lsch_launch mimics cuLaunchKernel: a kernel name as
 * lscore/cuda/ spells it, a 1-D grid and block, and an array of pointers
 * to the parameter values.  The byte size of every parameter is checked
 * against the kernel's signature, so an argument packed with the wrong width
 * (which a GPU would silently misread) fails the test instead.
 */
#include <ucontext.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_shim.h"
#include "blockwise.cu" /* includes mx.cu, which includes fp8.cu */
#include "nvfp4.cu"    /* includes mx.cu too (guarded) */
#include "optim.cu" /* includes scan.cu */
#include "update.cu"

namespace {

struct lsch_thread {
    ucontext_t ctx;
    bool done;
    unsigned long barriers, shuffles;
    unsigned long long slot[2];
};

const std::size_t STACK = 64 * 1024;
ucontext_t sched;
std::vector<lsch_thread> threads;
std::vector<char> stacks;
unsigned current;
void (*body)(void *);
void *body_arg;

void entry()
{
    body(body_arg);
    threads[current].done = true;
}

/* back to the scheduler until the waited-for threads have caught up */
void yield() { swapcontext(&threads[current].ctx, &sched); }

/* one block, its threads as contexts */
void run_block(unsigned block)
{
    threads.assign(block, lsch_thread());
    if (stacks.size() < block * STACK)
        stacks.resize(block * STACK);
    for (unsigned t = 0; t < block; t++) {
        lsch_thread &th = threads[t];
        getcontext(&th.ctx);
        th.ctx.uc_stack.ss_sp = &stacks[t * STACK];
        th.ctx.uc_stack.ss_size = STACK;
        th.ctx.uc_link = &sched;
        makecontext(&th.ctx, entry, 0);
    }
    for (;;) {
        unsigned long minb = ~0ul;
        for (auto &th : threads)
            if (!th.done && th.barriers < minb)
                minb = th.barriers;
        if (minb == ~0ul)
            return;
        bool ran = false;
        for (unsigned t = 0; t < block; t++) {
            lsch_thread &th = threads[t];
            if (th.done || th.barriers != minb)
                continue;
            unsigned long minw = ~0ul;
            unsigned w0 = t & ~31u, w1 = w0 + 32 < block ? w0 + 32 : block;
            for (unsigned l = w0; l < w1; l++)
                if (!threads[l].done && threads[l].shuffles < minw)
                    minw = threads[l].shuffles;
            if (th.shuffles != minw)
                continue;
            current = t;
            threadIdx = {t, 0, 0};
            swapcontext(&sched, &th.ctx);
            ran = true;
        }
        if (!ran)
            __builtin_trap();    /* threads wait on each other: a kernel bug */
    }
}

template <class... A, std::size_t... I>
void call(void (*k)(A...), void **params, std::index_sequence<I...>)
{
    k(*static_cast<A *>(params[I])...);
}

template <class... A>
int run(void (*k)(A...), unsigned grid, unsigned block, void **params,
        const long long *sizes, int nparams)
{
    const std::size_t want[] = {sizeof(A)..., 0};
    if (nparams != (int)sizeof...(A))
        return -2;
    for (int i = 0; i < nparams; i++)
        if ((long long)want[i] != sizes[i])
            return -3 - i;
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    struct launch {
        void (*k)(A...);
        void **params;
        static void go(void *p)
        {
            launch *l = static_cast<launch *>(p);
            call(l->k, l->params, std::index_sequence_for<A...>{});
        }
    };
    static launch l;    /* one launch at a time */
    l = {k, params};
    body = launch::go;
    body_arg = &l;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b, 0, 0};
        run_block(block);
    }
    body_arg = nullptr;
    return 0;
}

/* the scan kernels of one argument struct (a name with a comma: X takes __VA_ARGS__) */
#define LSCH_SCAN(X, M)                      \
    X(lsc_mt_unscale<lsc_f16, M>)            \
    X(lsc_mt_unscale<lsc_bf16, M>)           \
    X(lsc_mt_unscale<lsc_f32, M>)            \
    X(lsc_mt_unscale<lsc_f64, M>)            \
    X(lsc_mt_all_finite<lsc_f16, M>)         \
    X(lsc_mt_all_finite<lsc_bf16, M>)        \
    X(lsc_mt_all_finite<lsc_f32, M>)         \
    X(lsc_mt_all_finite<lsc_f64, M>)         \
    X(lsc_mt_unscale_norm<lsc_f16, M>)       \
    X(lsc_mt_unscale_norm<lsc_bf16, M>)      \
    X(lsc_mt_unscale_norm<lsc_f32, M>)       \
    X(lsc_mt_unscale_norm<lsc_f64, M>)       \
    X(lsc_mt_clip<lsc_f16, M>)               \
    X(lsc_mt_clip<lsc_bf16, M>)              \
    X(lsc_mt_clip<lsc_f32, M>)               \
    X(lsc_mt_clip<lsc_f64, M>)

/* a fused optimizer kernel for each gradient dtype (variant V of argument M) */
#define LSCH_GRADS(X, K, M, V)               \
    X(K<lsc_f16, M, V>)                      \
    X(K<lsc_bf16, M, V>)                     \
    X(K<lsc_f32, M, V>)

/* the check over argument M, for each gradient dtype */
#define LSCH_CHECK(X, M)                     \
    X(lsc_mt_opt_check<lsc_f16, M>)          \
    X(lsc_mt_opt_check<lsc_bf16, M>)         \
    X(lsc_mt_opt_check<lsc_f32, M>)

/* SGD's variants (LSC_OPT_SLOT = 1, | LSC_OPT_NESTEROV = 3), Adam's (LSC_OPT_AMSGRAD = 8) */
#define LSCH_OPTIM(X, SGD, ADAM)             \
    LSCH_GRADS(X, lsc_mt_sgd, SGD, 0)        \
    LSCH_GRADS(X, lsc_mt_sgd, SGD, 1)        \
    LSCH_GRADS(X, lsc_mt_sgd, SGD, 3)        \
    LSCH_GRADS(X, lsc_mt_adam, ADAM, 0)      \
    LSCH_GRADS(X, lsc_mt_adam, ADAM, 8)      \
    LSCH_CHECK(X, SGD)                       \
    LSCH_CHECK(X, ADAM)

/* the float8 casts of one input dtype code C and format F (fp8.cu) */
#define LSCH_FP8(X, C, F)                    \
    X(lsc_fp8_cast<C, F, 0>)                 \
    X(lsc_fp8_cast<C, F, 1>)                 \
    X(lsc_fp8_decode<C, F>)                  \
    X(lsc_fp8_cast2d<C, F, 0>)               \
    X(lsc_fp8_cast2d<C, F, 1>)               \
    X(lsc_fp8_dequant2d<C, F>)

#define LSCH_FP8_ALL(X)                      \
    LSCH_FP8(X, 1, 5)                        \
    LSCH_FP8(X, 2, 5)                        \
    LSCH_FP8(X, 3, 5)                        \
    LSCH_FP8(X, 1, 6)                        \
    LSCH_FP8(X, 2, 6)                        \
    LSCH_FP8(X, 3, 6)                        \
    X(lsc_fp8_amax2d<1>)                     \
    X(lsc_fp8_amax2d<2>)                     \
    X(lsc_fp8_amax2d<3>)

/* the block-scaled kernels of one input / output dtype code C (mx.cu) */
#define LSCH_MX(X, C)                        \
    X(lsc_mx_rows<C, 0>)                     \
    X(lsc_mx_rows<C, 1>)                     \
    X(lsc_mx_cols<C, 0>)                     \
    X(lsc_mx_cols<C, 1>)                     \
    X(lsc_mx_dequant<C>)

/* blockwise FP8 and square tiles of one input / output dtype code C (blockwise.cu) */
#define LSCH_BW(X, C)                        \
    X(lsc_bw_rows<C>)                        \
    X(lsc_bw_cols<C>)                        \
    X(lsc_bw_tiles<C>)                       \
    X(lsc_bw_dequant<C>)

/* TE's NVFP4 recipe kernels of one input / output dtype code C (nvfp4.cu) */
#define LSCH_NV4(X, C)                       \
    X(lsc_nv4_rows<C, 0>)                    \
    X(lsc_nv4_rows<C, 1>)                    \
    X(lsc_nv4_cols<C, 0>)                    \
    X(lsc_nv4_cols<C, 1>)                    \
    X(lsc_nv4_tiles<C, 0>)                   \
    X(lsc_nv4_tiles<C, 1>)                   \
    X(lsc_nv4_dequant<C>)

#define LSCH_KERNELS(X)                               \
    LSCH_SCAN(X, lsc_meta_4k)                         \
    LSCH_SCAN(X, lsc_meta_32k)                        \
    X(lsc_device_update)                              \
    LSCH_OPTIM(X, lsc_sgd_meta_4k, lsc_adam_meta_4k)  \
    LSCH_OPTIM(X, lsc_sgd_meta_32k, lsc_adam_meta_32k) \
    LSCH_FP8_ALL(X)                                   \
    LSCH_MX(X, 1)                                     \
    LSCH_MX(X, 2)                                     \
    LSCH_MX(X, 3)                                     \
    LSCH_BW(X, 1)                                     \
    LSCH_BW(X, 2)                                     \
    LSCH_BW(X, 3)                                     \
    LSCH_NV4(X, 1)                                    \
    LSCH_NV4(X, 2)                                    \
    LSCH_NV4(X, 3)                                    \
    X(lsc_nv4_rht)

}  // namespace

void __syncthreads()
{
    threads[current].barriers++;
    yield();
}

/* v through the running thread's warp: the value of lane (lane + delta) (down) or
 * (lane ^ delta) (xor), v itself where that lane is past the warp or the block */
unsigned long long lsch_shfl(unsigned long long v, unsigned delta, int xor_lanes)
{
    lsch_thread &me = threads[current];
    unsigned parity = me.shuffles & 1u;
    me.slot[parity] = v;
    me.shuffles++;
    yield();
    unsigned lane = current & 31u, to = xor_lanes ? lane ^ delta : lane + delta;
    unsigned src = (current & ~31u) + to;
    if (to >= 32u || src >= threads.size())
        return v;
    return threads[src].slot[parity];
}

extern "C" {

/* 0 on success, -1 unknown kernel, -2 wrong parameter count,
 * -3 - i parameter i has the wrong byte size */
int lsch_launch(const char *name, unsigned grid, unsigned block, void **params,
                const long long *sizes, int nparams)
{
    std::string n(name);
#define LSCH_DISPATCH(...)   \
    if (n == #__VA_ARGS__)   \
        return run(__VA_ARGS__, grid, block, params, sizes, nparams);
    LSCH_KERNELS(LSCH_DISPATCH)
#undef LSCH_DISPATCH
    return -1;
}

/* the kernel names this harness knows, one per line */
const char *lsch_names(void)
{
#define LSCH_NAME(...) #__VA_ARGS__ "\n"
    return LSCH_KERNELS(LSCH_NAME);
#undef LSCH_NAME
}

}  /* extern "C" */
