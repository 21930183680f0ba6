/* update.cu: the loss-scale state machine advanced on the device.
 *
 * Design: the kernel runs lsc_update from lsc_state.h, the very function the
 * CPU core (CyState) runs, on a device copy of the lsc_state struct.  The
 * host never mirrors the struct: it copies CyState.to_bytes() to the device
 * and reads the bytes back into CyState.from_bytes(), so a field added to the
 * struct needs no change here.  One thread does the work (the same
 * <<<1, 1>>> shape as torch's _amp_update_scale_), so no host sync is needed
 * between the scan kernels and the update.
 *
 * flags[LSC_DEV_FOUND]      set by the scan kernels; read here, then
 *                           cleared for the next step
 * flags[LSC_DEV_FLOOR]      set when lsc_update returns LSC_FLOOR_ERROR
 *                           (DeepSpeed, fairseq give up at their minimum); the
 *                           state is left as the policy leaves it, later
 *                           updates are ignored until the host reads the flag,
 *                           raises lscore.LossScaleFloorError and clears it
 * flags[LSC_DEV_APPLY]      this step's decision (1 apply, 0 skip)
 * vals[LSC_DEV_INV_SCALE]   inv_scale for the next unscale: 1/scale in double
 *                           for float64 policies, else float32 of the double
 *                           reciprocal (torch's rule; for a float32 scale it
 *                           equals the float32 division)
 * vals[LSC_DEV_SCALE]       the scale, as a double
 * scale32                   the scale rounded to float32 (the value a
 *                           sync-free minimize hands the backward pass)
 * applied                   when not null, a byte set to whether this
 *                           step's gradients were finite (the sync-free
 *                           optimizers' step result: their update is gated
 *                           by the found flag, not by flags[LSC_DEV_APPLY])
 * count                     when not null, Adam's device step counter,
 *                           advanced by one with the step (the fused update
 *                           read it before this launch)
 * advance                   0: only refresh vals and scale32 from the state
 *                           (after the host wrote it); applied and count
 *                           are left alone
 * The indices are those of lsc_codes.h (lscore._ext._codes.DEVICE_FLAGS, DEVICE_VALS).
 */
#include "lsc_state.h"

extern "C" __global__ void lsc_device_update(lsc_state *s, unsigned int *flags, double *vals,
                                             float *scale32, unsigned char *applied,
                                             long long *count, int advance)
{
    double inv;
    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    if (advance) {
        if (applied)
            *applied = flags[LSC_DEV_FOUND] == 0u ? 1u : 0u;
        if (count)
            *count += 1;
        if (flags[LSC_DEV_FLOOR]) {
            flags[LSC_DEV_APPLY] = 0u;
        } else {
            int r = lsc_update(s, flags[LSC_DEV_FOUND] == 0u);
            flags[LSC_DEV_APPLY] = r == LSC_APPLY ? 1u : 0u;
            if (r == LSC_FLOOR_ERROR)
                flags[LSC_DEV_FLOOR] = 1u;
        }
        flags[LSC_DEV_FOUND] = 0u;
    }
    inv = 1.0 / s->scale;
    if (s->precision != LSC_PREC_F64)
        inv = (double)(float)inv;
    vals[LSC_DEV_INV_SCALE] = inv;
    vals[LSC_DEV_SCALE] = s->scale;
    *scale32 = (float)s->scale;
}
