/* cuda_shim.h: just enough of CUDA for g++ to compile the .cu files of _ext/ as host code.
 *
 * Test-only (tests/helpers/cuda_host is not shipped).  harness.cpp runs the
 * threads of a block as cooperatively switched contexts: __syncthreads and
 * the warp shuffles switch back to its scheduler, which resumes a thread only
 * when every live thread of its block (its warp, for a shuffle) has reached
 * the same point, so shared memory (a static: one per kernel, and the blocks
 * of a launch run one after another), barriers and shuffles behave as on the
 * device.  Atomics and fences are plain, since one thread runs at a time.
 * LSC_DEVICE_EMULATION gives the kernels the device's conversion results
 * (lsc_half.h: a NaN narrows to 0x7FFF, as cvt.rn.f16.f32 gives it).
 */
#ifndef LSC_CUDA_SHIM_H
#define LSC_CUDA_SHIM_H

#include <cstring>

#define LSC_DEVICE_EMULATION 1
#define __shared__ static
#define __grid_constant__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct lsch_dim3 {
    unsigned int x, y, z;
};

/* the launch loop in harness.cpp sets these before each thread runs */
static lsch_dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline unsigned int __float_as_uint(float f)
{
    unsigned int w;
    std::memcpy(&w, &f, sizeof w);
    return w;
}

static inline float __uint_as_float(unsigned int w)
{
    float f;
    std::memcpy(&f, &w, sizeof f);
    return f;
}

static inline long long __double_as_longlong(double d)
{
    long long w;
    std::memcpy(&w, &d, sizeof w);
    return w;
}

static inline double __longlong_as_double(long long w)
{
    double d;
    std::memcpy(&d, &w, sizeof d);
    return d;
}

/* harness.cpp: the barrier, and one value through the running thread's warp */
void __syncthreads();
unsigned long long lsch_shfl(unsigned long long v, unsigned delta, int xor_lanes);

template <class T>
static inline T lsch_shfl_as(T v, unsigned delta, int xor_lanes)
{
    unsigned long long w = 0;
    std::memcpy(&w, &v, sizeof v);
    w = lsch_shfl(w, delta, xor_lanes);
    std::memcpy(&v, &w, sizeof v);
    return v;
}

template <class T>
static inline T __shfl_down_sync(unsigned, T v, unsigned delta)
{
    return lsch_shfl_as(v, delta, 0);
}

template <class T>
static inline T __shfl_xor_sync(unsigned, T v, unsigned lane_mask)
{
    return lsch_shfl_as(v, lane_mask, 1);
}

static inline unsigned int atomicAdd(unsigned int *p, unsigned int v)
{
    unsigned int old = *p;
    *p = old + v;
    return old;
}

static inline unsigned int atomicMax(unsigned int *p, unsigned int v)
{
    unsigned int old = *p;
    *p = old > v ? old : v;
    return old;
}

static inline void __threadfence() {}

#endif /* LSC_CUDA_SHIM_H */
