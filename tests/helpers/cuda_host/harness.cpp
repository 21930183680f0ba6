/* harness.cpp: runs lscore's CUDA kernels on the CPU, for tests only.
 *
 * The text of the .cu files in _ext/ that the GPU path hands to NVRTC is compiled here with
 * g++ and cuda_shim.h.  lsch_launch mimics cuLaunchKernel: a kernel name as
 * lscore/cuda/ spells it, a 1-D grid and block, and an array of pointers
 * to the parameter values.  The byte size of every parameter is checked
 * against the kernel's signature, so an argument packed with the wrong width
 * (which a GPU would silently misread) fails the test instead.
 */
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "cuda_shim.h"
#include "optim.cu" /* includes scan.cu */
#include "update.cu"

namespace {

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
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b, 0, 0};
        for (unsigned t = 0; t < block; t++) {
            threadIdx = {t, 0, 0};
            call(k, params, std::index_sequence_for<A...>{});
        }
    }
    return 0;
}

#define LSCH_KERNELS(X)                   \
    X(lsc_mt_unscale<lsc_f16>)            \
    X(lsc_mt_unscale<lsc_bf16>)           \
    X(lsc_mt_unscale<lsc_f32>)            \
    X(lsc_mt_unscale<lsc_f64>)            \
    X(lsc_mt_all_finite<lsc_f16>)         \
    X(lsc_mt_all_finite<lsc_bf16>)        \
    X(lsc_mt_all_finite<lsc_f32>)         \
    X(lsc_mt_all_finite<lsc_f64>)         \
    X(lsc_mt_unscale_norm<lsc_f16>)       \
    X(lsc_mt_unscale_norm<lsc_bf16>)      \
    X(lsc_mt_unscale_norm<lsc_f32>)       \
    X(lsc_mt_unscale_norm<lsc_f64>)       \
    X(lsc_mt_clip<lsc_f16>)               \
    X(lsc_mt_clip<lsc_bf16>)              \
    X(lsc_mt_clip<lsc_f32>)               \
    X(lsc_mt_clip<lsc_f64>)               \
    X(lsc_norm_fold)                      \
    X(lsc_norm_finish)                    \
    X(lsc_device_update)                  \
    X(lsc_mt_sgd<lsc_f16>)                \
    X(lsc_mt_sgd<lsc_bf16>)               \
    X(lsc_mt_sgd<lsc_f32>)                \
    X(lsc_mt_adam<lsc_f16>)               \
    X(lsc_mt_adam<lsc_bf16>)              \
    X(lsc_mt_adam<lsc_f32>)

}  // namespace

extern "C" {

/* 0 on success, -1 unknown kernel, -2 wrong parameter count,
 * -3 - i parameter i has the wrong byte size */
int lsch_launch(const char *name, unsigned grid, unsigned block, void **params,
                const long long *sizes, int nparams)
{
    std::string n(name);
#define LSCH_DISPATCH(K) \
    if (n == #K)         \
        return run(K, grid, block, params, sizes, nparams);
    LSCH_KERNELS(LSCH_DISPATCH)
#undef LSCH_DISPATCH
    return -1;
}

/* the kernel names this harness knows, one per line */
const char *lsch_names(void)
{
#define LSCH_NAME(K) #K "\n"
    return LSCH_KERNELS(LSCH_NAME);
#undef LSCH_NAME
}

}  /* extern "C" */
