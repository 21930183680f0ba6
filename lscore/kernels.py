"""The compiled kernels, unvalidated: the one door from the rooms above the core into lscore._ext.

Design: the adapters and the applications never import ``lscore._ext``;
what they need of it is named here, so the kernels can change their module
layout without touching them.  These functions trust their arguments: the
checked public API is ``lscore.all_finite`` / ``lscore.unscale_``.  Use
these where the caller has validated already (an adapter's hot path) or
measures the kernels themselves (``lscore bench``).

- ``all_finite(arrays, threads=0)``, ``unscale_(arrays, inv, stats=False,
  threads=0)``: the compiled walk and scan over nested NumPy arrays.
- ``all_finite_raw`` / ``unscale_raw``: the same over a table of raw
  buffers (uint64 pointers, int64 counts, int64 byte strides, int32 dtype
  codes); the caller keeps the memory alive.
- ``GradTable``: fills such a table from an optimizer's parameter groups
  (DLPack C exchange API or duck-typed tensor attributes).
- ``DeviceTable``: the same walk over nested device arrays (``READ_NUMPY``:
  NumPy arrays through NumPy's C API; ``READ_CUDA_ARRAY``: CuPy's
  attributes), checked and grouped by device and dtype into a
  ``DevicePlan`` that is cached and reused for the same arrays;
  ``plan_launches``: the chunked launch tables of one group, and
  ``pack_launches``: the launches' kernel arguments, packed as the kernels
  take them by value, and ``launch_params``: their ``void*[]`` (for
  ``lscore.cuda``).
- ``fp8_cast(x, out, scale, fmt, saturate=True, nan_sign=True,
  amax_nan=False)``: the scaled float8 cast ``out = fp8(float32(x) * scale)``
  of a float32 / float16 / bfloat16 array (strided read in place) into
  uint8 codes of format ``fmt`` (a name of ``FP8_FORMATS``), returning the
  input's amax (``FP8_FLAGS``: the flag bits of the device kernels);
  ``fp8_cast_rows(x, out, scales, amaxes, fmt, ...)``: the
  same per row (along the last axis) with one float32 scale per row, each
  row's amax written to ``amaxes``; ``fp8_amax(x, amax_nan=False)`` and
  ``fp8_amax_rows(x, amaxes, amax_nan=False)``: the amax pass alone;
  ``fp8_decode(q, out, fmt, scale=1.0)``: the codes widened back, divided
  by ``scale`` in float32 (exact with scale 1), ``fp8_decode_rows(q, out,
  scales, fmt)`` with one scale per row.  Each takes a last keyword
  ``threads`` (0: by the size, 1: serial, k: at most k threads); the bytes
  and amaxes are the same with any.
- ``fp8_scale_te(amax, out, fp8_max, pow2, eps)``,
  ``fp8_scale_torchao(amax, out, fp8_max, pow2, eps)``: the float8 scale of
  each amax (float32, C-contiguous) by TransformerEngine's
  ``compute_scale_from_amax`` or torchao's ``amax_to_scale``, into ``out``;
  ``fp8_scaled_max(fp8_max, margin)``: TransformerEngine's ``fp8_max *
  2**-margin`` in float32; ``Fp8Delayed(n, length, algo, amax_nan,
  scaled_max)``: the delayed-scaling state of n tensors (history, scale,
  scale_inv) with ``record(amax)`` (max-accumulate into the current row),
  ``set_current(amax)``, ``update()`` (TransformerEngine's roll and scale
  rule for all n) and ``load(history, scale, scale_inv)``.
- ``mx_scale(amax, elem, mode)``: the E8M0 block scale code of each float32
  amax for MX element format ``elem`` (a name of ``MX_ELEMS``) by the rule
  ``mode`` (a name of ``MX_MODES``: ``ocp`` the OCP rule as its reference
  implementation computes it, ``floor`` (the OCP rule as torchao runs it),
  ``ceil``, ``even``, ``rceil`` torchao's, ``te`` TransformerEngine's);
  ``mx_quantize(x, elem, mode, block=32, *, axis=-1, out=None)``: the
  blocks along the last axis (``axis=-1``) or down the columns of a 2-D
  array (``axis=0``, scales shaped (rows // block, cols)) of a float32 /
  bfloat16 / float16 array, read in place at any strides, quantized by
  that rule in one fused pass per orientation (block amax and narrowing
  from the same read, the GIL released), returning (scale codes, element
  codes; E2M1 packed two per byte, the first in the low nibble, with
  ``axis=0`` the two rows of a pair), into ``out=(scales, data)`` (1-byte
  C-contiguous arrays) when given; with ``tile=True`` in square tiles of
  side ``block`` of a 2-D array (one scale per tile, scales shaped
  (ceil(rows / block), ceil(cols / block)), partial tiles at the edges,
  float8 elements); under the float32 rules of ``BLOCKWISE_MODES``
  (``te-fp32``, ``torchao-fp32``; ``pow2=``, ``eps=``: TE's power-of-two
  scales, the amax floor) the scales are float32 inverse scales;
  ``mx_blockwise_scale(amax, elem, mode, pow2, eps, dtype)``: such a
  rule's float32 scale of each amax; ``nvfp4_quantize(x, pts=None, *,
  axis=-1, out=None)``: NVFP4's blocks of 16 the same way (E4M3 block
  scale codes, packed E2M1 codes), with the per-tensor scale ``pts`` that
  ``nvfp4_tensor_scale(amax)`` gives; a length that is not a multiple of
  the block is refused (ValueError); ``mx_block_shapes(shape, block,
  axis, e2m1)``: the (scales, element codes) shapes those passes write,
  the one check of a blocked axis (the CUDA kernels take it too);
  ``e8m0_decode(q)``,
  ``e8m0_encode(x)`` (powers of two), ``e2m1_encode(x)`` and
  ``e2m1_decode(q)`` (one code per byte): the two formats' codes.
- TransformerEngine v2.18's NVFP4 recipe (lsc_nvfp4.h):
  ``nvfp4_te_quantize(x, amax, *, axis=-1, tile=False, rht=False,
  seed=None, offset=0)``: one orientation of a float32 / float16 /
  bfloat16 array with the global amax `amax` (E4M3 scale codes, packed
  E2M1 codes): blocks of 16 along the last axis or (``axis=0``, a 2-D x)
  down the columns, or 16 x 16 tiles (scales (rows / 16, cols / 16)), the
  random Hadamard transform down the columns first (``rht``, bfloat16),
  stochastic rounding with lsc_nvfp4.h's counter-based draws (``seed``);
  ``hadamard16(x)`` / ``hadamard16_amax(x)``: the transform of a 2-D
  bfloat16 array down its columns (bfloat16 words) and its amax, NaN left
  out; ``philox4x32_10(counters, key)``, ``nvfp4_te_draws(subsequences,
  seed, offset)``: the generator and lscore's draws; ``e2m1_satfinite(v)``,
  ``e2m1_stochastic(v, r)``: the element rounding; ``nvfp4_te_scales(amax)``
  (S_enc, S_dec, mult), ``nvfp4_te_block_scale(amax_b, amax)`` (E4M3 code
  and element factor of each block amax), ``nvfp4_te_decode_scale(sf,
  amax)``: the two-level scale; ``nvfp4_te_shapes(shape, axis, tile)``:
  the shapes of the codes, the one check of an input's shape.
- ``isa()``, ``isa_levels()``, ``set_isa(name)``, ``pool_size()``: the CPU
  kernel level in use, the levels this CPU runs, a switch of every CPU
  kernel (the scan's, the float8 casts' and the block passes'; returns the
  previous level) and the number of threads a large call may run on, the
  caller included: the package has one thread pool, which the scan, the
  float8 kernels and the block passes share (as many threads as CPUs this
  process may use, at most 8, or fewer with the environment variable
  ``LSCORE_NUM_THREADS``).
- ``read_bandwidth(a)``, ``copy_bandwidth(dst, src)``: a plain C read loop
  and memcpy over an array's bytes, the bandwidth references of the bench.
- ``DEVICE_FLAGS``, ``DEVICE_VALS`` (slot names -> index, with their counts
  ``NDEVICE_FLAGS``, ``NDEVICE_VALS``), ``OPTIM_FLAGS`` and ``NORM_FLAGS`` (bit
  names -> bit), ``META`` and ``OPT_META`` (the scan kernels' and the fused
  optimizers' argument structs):
  the layout lsc_codes.h gives the CUDA kernels' shared flags and values and
  the fused optimizers' flags, for ``lscore.cuda``.
"""

from lscore._ext import _fp8, _mx, _nvfp4, _scan
from lscore._ext._codes import (
    DEVICE_FLAGS,
    DEVICE_VALS,
    META,
    NDEVICE_FLAGS,
    NDEVICE_VALS,
    NORM_FLAGS,
    OPT_META,
    OPTIM_FLAGS,
)
from lscore._ext._fp8 import FORMATS as FP8_FORMATS
from lscore._ext._fp8 import amax as fp8_amax
from lscore._ext._fp8 import amax_rows as fp8_amax_rows
from lscore._ext._fp8 import cast as fp8_cast
from lscore._ext._fp8 import cast_rows as fp8_cast_rows
from lscore._ext._fp8 import decode as fp8_decode
from lscore._ext._fp8 import decode_rows as fp8_decode_rows
from lscore._ext._fp8_scale import Fp8Delayed
from lscore._ext._fp8_scale import scale_te as fp8_scale_te
from lscore._ext._fp8_scale import scale_torchao as fp8_scale_torchao
from lscore._ext._fp8_scale import scaled_max as fp8_scaled_max
from lscore._ext._grads import GradTable
from lscore._ext._mx import ELEMS as MX_ELEMS
from lscore._ext._mx import MODES as MX_MODES
from lscore._ext._mx import WIDE_MODES as BLOCKWISE_MODES
from lscore._ext._mx import block_shapes as mx_block_shapes
from lscore._ext._mx import blockwise_scale as mx_blockwise_scale
from lscore._ext._mx import (
    e2m1_decode,
    e2m1_encode,
    e8m0_decode,
    e8m0_encode,
    nvfp4_quantize,
    nvfp4_tensor_scale,
)
from lscore._ext._mx import quantize as mx_quantize
from lscore._ext._mx import scale as mx_scale
from lscore._ext._nvfp4 import block_scale as nvfp4_te_block_scale
from lscore._ext._nvfp4 import decode_scale as nvfp4_te_decode_scale
from lscore._ext._nvfp4 import draws as nvfp4_te_draws
from lscore._ext._nvfp4 import (
    e2m1_satfinite,
    e2m1_stochastic,
    hadamard16,
    hadamard16_amax,
    philox4x32_10,
)
from lscore._ext._nvfp4 import quantize as nvfp4_te_quantize
from lscore._ext._nvfp4 import scales as nvfp4_te_scales
from lscore._ext._nvfp4 import shapes as nvfp4_te_shapes
from lscore._ext._pack import launch_params, pack_launches, plan_launches
from lscore._ext._scan import (
    all_finite,
    all_finite_raw,
    isa,
    isa_levels,
    pool_size,
    unscale_,
    unscale_raw,
)
from lscore._ext._scan import bench_copy as copy_bandwidth
from lscore._ext._scan import bench_read_u64 as read_bandwidth
from lscore._ext._walk import (
    DLPACK_DEVICES,
    READ_CUDA_ARRAY,
    READ_DLPACK,
    READ_NUMPY,
    DevicePlan,
    DeviceTable,
)

# the block passes start at the float8 casts' level (the best, or LSCORE_ISA's)
_mx.set_isa(_fp8.isa())
_nvfp4.set_isa(_fp8.isa())


def set_isa(name: str) -> str:
    """Run every CPU kernel at ISA level `name` ("" = the best this CPU runs); returns the old."""
    old = _scan.set_isa(name)
    _fp8.set_isa(name)
    _mx.set_isa(name)
    _nvfp4.set_isa(name)
    return old


# re-bound so that their doc comments reach the API reference
#: reader code of a NumPy array (read through NumPy's C API)
READ_NUMPY = READ_NUMPY
#: reader code of a CUDA array (read through ``__cuda_array_interface__``)
READ_CUDA_ARRAY = READ_CUDA_ARRAY
#: reader code of a tensor read through its type's DLPack C exchange API (torch)
READ_DLPACK = READ_DLPACK
#: DLPack's device types, by torch's device type names ("cpu", "cuda"), for READ_DLPACK
DLPACK_DEVICES = DLPACK_DEVICES
#: float8 format name -> dtype code, the formats of ``fp8_cast`` / ``fp8_decode``
FP8_FORMATS = FP8_FORMATS
#: the float8 kernels' flag bits (lsc_fp8.h) by name: SAT, NAN_SIGN, AMAX_NAN
FP8_FLAGS = {"SAT": _fp8.SAT, "NAN_SIGN": _fp8.NAN_SIGN, "AMAX_NAN": _fp8.AMAX_NAN}
#: block scale rule name -> code, the modes of ``mx_scale`` / ``mx_quantize``
MX_MODES = MX_MODES
#: float32 scale rule name -> code (blockwise FP8), the modes of ``mx_blockwise_scale``,
#: which ``mx_quantize`` takes too
BLOCKWISE_MODES = BLOCKWISE_MODES
#: MX element format name -> code, the formats of ``mx_scale`` / ``mx_quantize``
MX_ELEMS = MX_ELEMS
#: the CUDA kernels' shared device flags: slot name -> index
DEVICE_FLAGS = DEVICE_FLAGS
#: the CUDA kernels' shared device values: slot name -> index
DEVICE_VALS = DEVICE_VALS
#: the number of device flag slots
NDEVICE_FLAGS = NDEVICE_FLAGS
#: the number of device value slots
NDEVICE_VALS = NDEVICE_VALS
#: the fused optimizers' flag bits: name -> bit
OPTIM_FLAGS = OPTIM_FLAGS
#: the one-pass norm kernels' flag bits: name -> bit
NORM_FLAGS = NORM_FLAGS
#: the scan kernels' argument structs: name -> (tensors, blocks) one launch's argument holds
META = META
#: the fused optimizers' argument structs: name -> (addresses per tensor, tensors, blocks)
OPT_META = OPT_META

__all__ = [
    "BLOCKWISE_MODES",
    "DEVICE_FLAGS",
    "DEVICE_VALS",
    "DLPACK_DEVICES",
    "FP8_FLAGS",
    "FP8_FORMATS",
    "META",
    "MX_ELEMS",
    "MX_MODES",
    "NDEVICE_FLAGS",
    "NDEVICE_VALS",
    "NORM_FLAGS",
    "OPTIM_FLAGS",
    "OPT_META",
    "READ_CUDA_ARRAY",
    "READ_DLPACK",
    "READ_NUMPY",
    "DevicePlan",
    "DeviceTable",
    "Fp8Delayed",
    "GradTable",
    "all_finite",
    "all_finite_raw",
    "copy_bandwidth",
    "e2m1_decode",
    "e2m1_encode",
    "e2m1_satfinite",
    "e2m1_stochastic",
    "e8m0_decode",
    "e8m0_encode",
    "fp8_amax",
    "fp8_amax_rows",
    "fp8_cast",
    "fp8_cast_rows",
    "fp8_decode",
    "fp8_decode_rows",
    "fp8_scale_te",
    "fp8_scale_torchao",
    "fp8_scaled_max",
    "hadamard16",
    "hadamard16_amax",
    "isa",
    "isa_levels",
    "launch_params",
    "mx_block_shapes",
    "mx_blockwise_scale",
    "mx_quantize",
    "mx_scale",
    "nvfp4_quantize",
    "nvfp4_te_block_scale",
    "nvfp4_te_decode_scale",
    "nvfp4_te_draws",
    "nvfp4_te_quantize",
    "nvfp4_te_scales",
    "nvfp4_te_shapes",
    "nvfp4_tensor_scale",
    "pack_launches",
    "philox4x32_10",
    "plan_launches",
    "pool_size",
    "read_bandwidth",
    "set_isa",
    "unscale_",
    "unscale_raw",
]
