"""The float8 casts on the GPU (_ext/fp8.cu): NVRTC compiles them for sm_80 (the scalar
rule) and sm_90 (cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32), and the host harness runs both
paths bit for bit like the CPU kernels.

The harness runs the instruction as the PTX ISA documents .satfinite (a NaN gives some NaN,
|x| > MAX_NORM gives sign-preserved MAX_NORM, the rest rounds to nearest even), with a NaN
word of its own, through the kernel's fix to the flags' rule (lsc_fp8.h).
"""

import shutil

import numpy as np
import pytest

from lscore import cuda, kernels
from lscore._ext import _fp8
from lscore.dtypes import Code
from lscore.fp8.checks import cast_options

ml_dtypes = pytest.importorskip("ml_dtypes")

E4, E5 = "float8_e4m3fn", "float8_e5m2"
FMT = {E4: int(Code.E4M3FN), E5: int(Code.E5M2)}
SRC = {"float16": int(Code.F16), "bfloat16": int(Code.BF16), "float32": int(Code.F32)}
NAMES = tuple(
    name
    for c in SRC.values()
    for f in FMT.values()
    for name in (
        f"lsc_fp8_cast<{c}, {f}, 0>",
        f"lsc_fp8_cast<{c}, {f}, 1>",
        f"lsc_fp8_decode<{c}, {f}>",
    )
)


def ptx_of(arch):
    ptx, lowered, log = cuda.compile_kernels("fp8.cu", arch)
    assert log == "", log
    assert set(lowered) == set(NAMES)
    return ptx.rstrip(b"\x00").decode()


@pytest.fixture
def fp8_kernels(cupy_compiler, monkeypatch):
    monkeypatch.setitem(cuda.KERNELS, "fp8.cu", NAMES)


@pytest.mark.parametrize("arch", ["80", "90"])
def test_compiles_with_nvrtc(fp8_kernels, arch):
    ptx = ptx_of(arch)
    assert f".target sm_{arch}" in ptx
    assert ".ftz" not in ptx and "fma." not in ptx and "approx" not in ptx
    hw = ("cvt.rn.satfinite.e4m3x2.f32" in ptx, "cvt.rn.satfinite.e5m2x2.f32" in ptx)
    assert hw == ((True, True) if arch == "90" else (False, False))


if shutil.which("g++") is None:  # pragma: no cover
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host


@pytest.fixture(scope="module")
def backend():
    return cuda_host.HostBackend()


def inputs():
    """Every float16 and bfloat16 word, and float32 patterns around the rounding boundaries."""
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    rng = np.random.default_rng(5)
    exp = np.arange(100, 150, dtype=np.uint32)[:, None] << 23
    mant = rng.integers(0, 1 << 23, 64, dtype=np.uint32)
    mant = np.concatenate([mant, (np.arange(16, dtype=np.uint32) << 19), [0x7FFFFF, 0x80000]])
    f32 = (exp | mant[None, :]).ravel()
    f32 = np.concatenate([f32, f32 | 0x80000000, [0x7F800000, 0xFF800000, 0x7FC00001, 0xFFC00000]])
    return {
        "float16": words.view(np.float16),
        "bfloat16": words.view(ml_dtypes.bfloat16),
        "float32": f32.astype(np.uint32).view(np.float32),
    }


@pytest.mark.parametrize("src", sorted(SRC))
@pytest.mark.parametrize("fmt", [E4, E5])
@pytest.mark.parametrize("hw", [0, 1], ids=["scalar", "cvt-satfinite"])
def test_harness_casts_like_the_cpu(backend, src, fmt, hw):
    x = inputs()[src]
    name = f"lsc_fp8_cast<{SRC[src]}, {FMT[fmt]}, {hw}>"
    for scale in (1.0, 3.0, 1 / 3):
        for saturate in (True, False):
            for nan_sign in (True, False):
                amax_nan = not nan_sign
                flags = (
                    (_fp8.SAT if saturate else 0)
                    | (_fp8.NAN_SIGN if nan_sign else 0)
                    | (_fp8.AMAX_NAN if amax_nan else 0)
                )
                q = np.full(x.size, 0xAA, np.uint8)
                amax = np.zeros(1, np.uint32)
                args = (
                    np.uint64(x.ctypes.data),
                    np.int64(x.size - 1),  # an odd count: the last pair is half a pair
                    np.float32(scale),
                    np.uint64(q.ctypes.data),
                    np.int32(flags),
                    np.uint64(amax.ctypes.data),
                )
                backend.launch(name, 3, 64, args)
                want = np.empty(x.size - 1, np.uint8)
                want_amax = kernels.fp8_cast(x[:-1], want, scale, fmt, saturate, nan_sign, amax_nan)
                np.testing.assert_array_equal(q[:-1], want, err_msg=f"{scale} {flags}")
                assert q[-1] == 0xAA
                got_amax = amax.view(np.float32)[0] if amax[0] <= 0x7F800000 else np.nan
                assert (np.isnan(got_amax) and np.isnan(want_amax)) or got_amax == want_amax


@pytest.mark.parametrize("dst", sorted(SRC))
@pytest.mark.parametrize("fmt", [E4, E5])
def test_harness_decodes_like_the_cpu(backend, dst, fmt):
    codes = np.arange(256, dtype=np.uint8)
    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[dst]
    out = np.zeros(256, dt)
    backend.launch(
        f"lsc_fp8_decode<{SRC[dst]}, {FMT[fmt]}>",
        2,
        32,
        (np.uint64(codes.ctypes.data), np.int64(256), np.uint64(out.ctypes.data)),
    )
    want = np.empty(256, dt)
    kernels.fp8_decode(codes, want, fmt)
    words, want_words = out.view(f"u{out.itemsize}"), want.view(f"u{out.itemsize}")
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(words[~nan], want_words[~nan])
    # float32 keeps the CPU's NaN words; a narrowed NaN is the instruction's canonical one
    assert (words[nan] == (want_words[nan] if dst == "float32" else cuda_host.DEVICE_NAN16)).all()


# ---- quantize: lscore.cuda.fp8's launches of the amax, cast and dequantize kernels ----------

from lscore.cuda import fp8 as cuda_fp8
from lscore.cuda import views as cuda_views


def view(a):
    return cuda_views.DeviceView(a.ctypes.data, a.shape, a.strides, a.dtype.name, a.itemsize)


def layouts(dt):
    """Inputs with specials, each contiguous, strided, with a reversed last axis, and a
    3-D view whose leading axes merge."""
    rng = np.random.default_rng(11)
    base = (rng.standard_normal((6, 40)) * 10.0 ** rng.integers(-6, 6, (6, 40))).astype(np.float32)
    specials = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-42, 600, 70000], np.float32)
    flat = base.ravel()
    flat[::7] = np.resize(specials, flat[::7].size)
    with np.errstate(over="ignore"):  # float16 overflows to Inf: one more special
        x = base.astype(dt)
    return {
        "contiguous": x,
        "strided": x[::2, 1::3],
        "reversed": x[:, ::-1],
        "3-d": x.reshape(3, 2, 40)[:, :, 5:30],
        "1-d": x[1],
    }


@pytest.mark.parametrize("src", sorted(SRC))
@pytest.mark.parametrize("per_row", [False, True], ids=["tensor", "row"])
def test_quantize_launches_equal_the_cpu_kernels(backend, src, per_row):
    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[src]
    launcher = cuda_fp8.Float8Launcher(backend, block=32, max_blocks=3)
    for what, x in layouts(dt).items():
        rows = int(np.prod(x.shape[:-1])) if per_row else 1
        scales = (np.arange(rows, dtype=np.float32) % 4 + 1) * np.float32(1 / 3)
        for propagate in (False, True):
            words = np.zeros(rows, np.uint32)
            launcher.amax(view(x), words.ctypes.data, per_row=per_row, propagate=propagate)
            if per_row:
                want = np.empty(rows, np.float32)
                kernels.fp8_amax_rows(x, want, propagate)
            else:
                want = np.float32(kernels.fp8_amax(x, propagate)).reshape(1)
            got = words.view(np.float32)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
            np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)], err_msg=what)
        for fmt in (E4, E5):
            for hw in (0, 1):
                for saturate, nan_sign, propagate in ((True, True, True), (False, False, False)):
                    flags = (
                        (_fp8.SAT if saturate else 0)
                        | (_fp8.NAN_SIGN if nan_sign else 0)
                        | (_fp8.AMAX_NAN if propagate else 0)
                    )
                    q = np.full(x.shape, 0xAA, np.uint8)
                    words = np.zeros(rows, np.uint32)
                    on_device = np.ascontiguousarray(scales)
                    launcher.cast(
                        view(x),
                        q.ctypes.data,
                        words.ctypes.data,
                        fmt=fmt,
                        scale=0.0,
                        scales_ptr=on_device.ctypes.data,
                        per_row=per_row,
                        flags=flags,
                        hw=hw,
                    )
                    want = np.empty(x.shape, np.uint8)
                    wam = np.empty(rows, np.float32)
                    if per_row:
                        kernels.fp8_cast_rows(
                            x, want, scales, wam, fmt, saturate, nan_sign, propagate
                        )
                    else:
                        wam[0] = kernels.fp8_cast(
                            x, want, float(scales[0]), fmt, saturate, nan_sign, propagate
                        )
                    np.testing.assert_array_equal(q, want, err_msg=f"{what} {fmt} {hw} {flags}")
                    got = words.view(np.float32)
                    assert np.array_equal(np.isnan(got), np.isnan(wam))
                    assert np.array_equal(got[~np.isnan(got)], wam[~np.isnan(wam)])
                    # a scale given by value, per tensor
                    if not per_row:
                        q2 = np.full(x.shape, 0xAA, np.uint8)
                        words2 = np.zeros(1, np.uint32)  # alive until the launch is done
                        launcher.cast(
                            view(x),
                            q2.ctypes.data,
                            words2.ctypes.data,
                            fmt=fmt,
                            scale=float(scales[0]),
                            scales_ptr=0,
                            per_row=False,
                            flags=flags,
                            hw=hw,
                        )
                        np.testing.assert_array_equal(q2, want)
                qs = want[..., ::-1] if what == "reversed" else want
                for out_dt in (np.float32, np.float16, ml_dtypes.bfloat16):
                    out = np.zeros(qs.shape, out_dt)
                    launcher.dequantize(
                        view(qs),
                        out.ctypes.data,
                        np.dtype(out_dt).name,
                        fmt=fmt,
                        scale=0.0,
                        scales_ptr=scales.ctypes.data,
                        per_row=per_row,
                    )
                    ref = np.empty(qs.shape, out_dt)
                    if per_row:
                        kernels.fp8_decode_rows(qs, ref, scales, fmt)
                    else:
                        kernels.fp8_decode(qs, ref, fmt, float(scales[0]))
                    w, rw = out.view(f"u{out.itemsize}"), ref.view(f"u{out.itemsize}")
                    nan = np.isnan(ref.astype(np.float32))
                    np.testing.assert_array_equal(w[~nan], rw[~nan])
                    assert np.isnan(out.astype(np.float32)[nan]).all()


def test_leading_axes_that_do_not_merge_are_refused():
    x = np.zeros((4, 6, 8), np.float32)[:, ::2, :].transpose(1, 0, 2)
    with pytest.raises(ValueError, match="leading axes must merge into one stride"):
        cuda_views.view2d(view(x), True)
    assert cuda_views.view2d(view(np.zeros((3, 5), np.float32)), False) == (1, 15, 15, 1)
    assert cuda_views.view2d(view(np.zeros((3, 5), np.float32)), True) == (3, 5, 5, 1)


@pytest.mark.parametrize("block", [40, 96])
def test_amax_per_tensor_folds_over_warps_and_partial_ones(backend, block):
    """The per-tensor amax word gets the block's max (warps of a block, a partial last warp),
    from the amax pass and from the cast: the largest |x| wherever it sits, a NaN by the
    rule, and nothing from threads past the end."""
    launcher = cuda_fp8.Float8Launcher(backend, block=block, max_blocks=2)
    rng = np.random.default_rng(block)
    for n in (1, 7, 2 * block - 1, 5 * block + 3, 3000):
        for at in sorted({0, n // 2, n - 1}):
            x = rng.uniform(-1.0, 1.0, n).astype(np.float32)
            x[at] = -5.5
            for nan_at, propagate in ((None, False), ((at + 1) % n, False), ((at + 1) % n, True)):
                y = x.copy()
                if nan_at is not None and nan_at != at:
                    y[nan_at] = np.nan
                want = np.float32(kernels.fp8_amax(y, propagate))
                words = np.zeros(1, np.uint32)
                launcher.amax(view(y), words.ctypes.data, per_row=False, propagate=propagate)
                q = np.empty(n, np.uint8)
                cast_words = np.zeros(1, np.uint32)
                flags = _fp8.SAT | (_fp8.AMAX_NAN if propagate else 0)
                launcher.cast(
                    view(y),
                    q.ctypes.data,
                    cast_words.ctypes.data,
                    fmt=E4,
                    scale=1.0,
                    scales_ptr=0,
                    per_row=False,
                    flags=flags,
                )
                for got in (words.view(np.float32)[0], cast_words.view(np.float32)[0]):
                    assert np.array_equal(got, want, equal_nan=True), (n, at, nan_at, got, want)


@pytest.mark.parametrize("src", sorted(SRC))
def test_contiguous_tensors_take_16_byte_accesses_with_the_same_codes(backend, src):
    """A C-contiguous tensor from a 16-byte aligned address is read 16 bytes at a time (and
    its codes stored 8 or 4 at a time where their address allows): the same codes and amax
    as the CPU kernels for every length (tails of 0..7 elements), from aligned and unaligned
    addresses and into aligned and unaligned codes (the element path)."""
    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[src]
    launcher = cuda_fp8.Float8Launcher(backend, block=64, max_blocks=2)
    rng = np.random.default_rng(7)
    specials = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-42, 600, 70000], np.float32)
    for n in (1, 7, 8, 9, 31, 33, 517):
        base = (rng.standard_normal(n + 9) * 100).astype(np.float32)
        base[rng.integers(0, n + 9, 5)] = rng.choice(specials, 5)
        with np.errstate(over="ignore"):
            buf = base.astype(dt)
        for x_at in (0, 1):
            x = buf[x_at : x_at + n]
            aligned = x.ctypes.data % 16 == 0
            assert aligned == (x_at == 0 or (x_at * x.itemsize) % 16 == 0)
            for q_at in (0, 1):
                for fmt, hw, flags in ((E4, 1, _fp8.SAT | _fp8.NAN_SIGN), (E5, 0, _fp8.AMAX_NAN)):
                    qbuf = np.full(n + 9, 0xAA, np.uint8)
                    q = qbuf[q_at : q_at + n]
                    words, amax_words = np.zeros(1, np.uint32), np.zeros(1, np.uint32)
                    launcher.cast(
                        view(x),
                        q.ctypes.data,
                        words.ctypes.data,
                        fmt=fmt,
                        scale=0.375,
                        scales_ptr=0,
                        per_row=False,
                        flags=flags,
                        hw=hw,
                    )
                    propagate = bool(flags & _fp8.AMAX_NAN)
                    launcher.amax(
                        view(x), amax_words.ctypes.data, per_row=False, propagate=propagate
                    )
                    want = np.empty(n, np.uint8)
                    sat, sign = bool(flags & _fp8.SAT), bool(flags & _fp8.NAN_SIGN)
                    wam = np.float32(kernels.fp8_cast(x, want, 0.375, fmt, sat, sign, propagate))
                    what = (n, x_at, q_at, fmt, hw)
                    np.testing.assert_array_equal(q, want, err_msg=str(what))
                    assert (qbuf[:q_at] == 0xAA).all() and (qbuf[q_at + n :] == 0xAA).all()
                    for got in (words, amax_words):
                        assert np.array_equal(got.view(np.float32)[0], wam, equal_nan=True), what


def harness_arrays(backend):
    """lscore.cuda.fp8.Float8Arrays bound to NumPy arrays as device memory and the harness."""
    launcher = cuda_fp8.Float8Launcher(backend, block=32, max_blocks=4)
    return cuda_fp8.Float8Arrays(
        view=view,
        empty=lambda like, shape, dt: np.empty(
            shape, ml_dtypes.bfloat16 if dt == "bfloat16" else dt
        ),
        zeros=lambda like, n, dt: np.zeros(n, dt),
        upload=lambda like, host: np.array(host, np.float32),
        as_float32=lambda w: w.view(np.float32),
        to_host=np.asarray,
        all_positive_finite=lambda a: bool(((a > 0) & np.isfinite(a)).all()),
        launcher=lambda a: launcher,
        stream=lambda a: None,
    )


def test_device_arrays_quantize_like_lscore_fp8(backend):
    """The device path's amax / quantize / dequantize (checks, outputs, launches) give
    lscore.fp8.casting's NumPy results."""
    import lscore.fp8 as Q

    dev = harness_arrays(backend)
    x = layouts(ml_dtypes.bfloat16)["strided"]
    rows = np.arange(1, 4, dtype=np.float32).reshape(3, 1) * np.float32(0.25)
    for kw in (
        dict(scale=3.0),
        dict(scale=rows, axis=-1),
        dict(scale=0.5, fmt="e5m2", saturate=False),
    ):
        opts = {k: v for k, v in kw.items() if k != "scale"}
        c = cast_options(amax_nan="propagate", **opts)
        q, a = dev.quantize(x, kw["scale"], c)
        wq, wa = Q.quantize(x, amax_nan="propagate", **kw)
        np.testing.assert_array_equal(q, wq.view(np.uint8))
        np.testing.assert_array_equal(np.isnan(a), np.isnan(wa))
        np.testing.assert_array_equal(a[~np.isnan(a)], wa[~np.isnan(wa)])
        axis = kw.get("axis")
        fmt = kw.get("fmt", "e4m3fn")
        for dt in ("float32", "bfloat16"):
            d = dev.dequantize(q, kw["scale"], dt, axis=axis, fmt=fmt)
            wd = Q.dequantize(wq, kw["scale"], dt, axis=axis)
            # NaN by value: a narrowed NaN is the device's canonical word (DEVICE_NAN16)
            nan = np.isnan(wd.astype(np.float32))
            assert np.isnan(d.astype(np.float32)[nan]).all()
            np.testing.assert_array_equal(
                d.view(np.uint8).reshape((*d.shape, -1))[~nan],
                wd.view(np.uint8).reshape((*d.shape, -1))[~nan],
            )
    np.testing.assert_array_equal(dev.amax(x, -1), Q.amax(x, -1))
    out = np.full(x.shape, 0xAA, np.uint8)
    c = cast_options()
    assert dev.quantize(x, 2.0, c, out=out)[0] is out
    with pytest.raises(ValueError, match="positive finite float32"):
        dev.quantize(x, 0.0, c, out=out)
    with pytest.raises(ValueError, match="per row"):
        dev.quantize(x, np.ones(4, np.float32), cast_options(axis=-1), out=out)
    with pytest.raises(ValueError, match="input's shape"):
        dev.quantize(x, 1.0, c, out=np.zeros(3, np.uint8))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        dev.quantize(np.zeros(3, np.float64), 1.0, c)
    assert (out[0] != 0xAA).all()


@pytest.mark.parametrize("name", ["te-current", "torchao-tensorwise", "torchao-rowwise"])
def test_device_quantize_current_like_numpy(backend, name):
    """quantize_current on device arrays (the amax on the device, the recipe's scale on the
    host, the cast) gives lscore.fp8.quantize_current's NumPy result."""
    import lscore.fp8
    from lscore.fp8 import casting as q_mod

    r = lscore.fp8.recipe(name)
    for what, x in layouts(np.float32).items():
        if what == "3-d" and r.granularity == "row":
            x = np.ascontiguousarray(x)
        got = q_mod.current_on(harness_arrays(backend), x, r, "float8_e4m3fn")
        want = lscore.fp8.quantize_current(x, r)
        for g, w in (
            (got.scale, want.scale),
            (got.scale_inv, want.scale_inv),
            (got.amax, want.amax),
        ):
            g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
            assert g.shape == w.shape
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
            np.testing.assert_array_equal(g[~np.isnan(g)], w[~np.isnan(w)])
        np.testing.assert_array_equal(got.data, want.data.view(np.uint8), err_msg=what)
