/* lsc_warp.h: the lanes of a block's warps, for the shuffle folds of the CUDA
 * kernels (scan.cu's block sums, fp8.cu's block amax).  Device code only: on a
 * GPU, or in the host test harness (which defines blockDim and threadIdx). */
#ifndef LSC_WARP_H
#define LSC_WARP_H

/* The lanes of the calling thread's warp that exist, and in *mask the shuffle
 * mask over them: a block need not be whole warps (the host harness runs odd
 * sizes), so a fold takes only partners below the count. */
static __device__ __forceinline__ unsigned lsc_warp_live(unsigned *mask)
{
    unsigned live = blockDim.x - (threadIdx.x >> 5) * 32u;
    live = live < 32u ? live : 32u;
    *mask = live == 32u ? 0xFFFFFFFFu : (1u << live) - 1u;
    return live;
}

#endif
