"""atheris fuzz target: the compiled scan and fused unscale against lscore._reference.

Random bytes become arrays of a random dtype and layout (contiguous, strided,
reversed, transposed, byte-swapped, unaligned, zero-stride, 0-d, empty);
``lscore.all_finite`` / ``lscore.unscale_`` must give the reference's answer,
raise the same exception type, and ``unscale_`` must write the same bits
(NaN payloads aside).  See tests/fuzz/README.md for how to run it.
"""

import sys

import atheris

with atheris.instrument_imports():
    import numpy as np

    import lscore
    from lscore import _reference as ref

try:
    import ml_dtypes

    EXTRA = [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
except ImportError:  # pragma: no cover
    EXTRA = []

DTYPES = [
    np.dtype(t) for t in [np.float16, np.float32, np.float64, np.int8, np.uint16, np.bool_, *EXTRA]
]
LAYOUTS = [
    "contiguous",
    "strided",
    "reversed",
    "transposed",
    "byteswapped",
    "unaligned",
    "zero_stride",
    "zero_d",
    "empty",
]
INV = [0.5, 2.0, 1 / 3, 1.0, 1e-5, 65536.0, 3e-39, 1e30, 1e-45]


def make(fdp: atheris.FuzzedDataProvider) -> np.ndarray:
    dt = fdp.PickValueInList(DTYPES)
    layout = fdp.PickValueInList(LAYOUTS)
    n = fdp.ConsumeIntInRange(0, 300)
    raw = fdp.ConsumeBytes(n * dt.itemsize)
    n = len(raw) // dt.itemsize
    flat = np.frombuffer(raw[: n * dt.itemsize], np.uint8).copy().view(dt)
    if layout == "strided" and n:
        k = fdp.ConsumeIntInRange(1, 4)
        out = np.zeros(n * k, dt)
        out[::k] = flat
        return out[::k]
    if layout == "reversed":
        return flat[::-1]
    if layout == "transposed" and n >= 4:
        r = n // 2
        return flat[: 2 * r].reshape(2, r).T
    if layout == "byteswapped" and dt.itemsize > 1:
        return flat.view(dt.newbyteorder()).copy()  # same bytes, other byte order
    if layout == "unaligned":
        buf = np.zeros(n * dt.itemsize + 1, np.uint8)
        out = buf[1:].view(dt)
        out[...] = flat
        return out
    if layout == "zero_stride" and n:
        count = fdp.ConsumeIntInRange(1, 5000)
        words = flat[:1].view(f"u{dt.itemsize}")  # as_strided needs a builtin dtype
        return np.lib.stride_tricks.as_strided(words, shape=(count,), strides=(0,)).view(dt)
    if layout == "zero_d" and n:
        return flat[:1].reshape(())
    if layout == "empty":
        return np.zeros((0, fdp.ConsumeIntInRange(0, 3)), dt)
    return flat


def outcome(fn, *args):
    try:
        return fn(*args), None
    except (TypeError, ValueError) as e:
        return None, type(e)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(fa)
    return np.array_equal(nan, np.isnan(fb)) and np.array_equal(fa[~nan], fb[~nan])


def TestOneInput(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    arrays = [make(fdp) for _ in range(fdp.ConsumeIntInRange(1, 4))]
    nested = arrays if fdp.ConsumeBool() else {"a": arrays[:1], "b": tuple(arrays[1:])}
    want = outcome(ref.all_finite, nested)
    got = outcome(lscore.all_finite, nested)
    if got != want:
        raise AssertionError(f"all_finite: got {got}, reference {want}: {arrays!r}")
    if not all(a.flags.writeable for a in arrays):
        return
    inv = fdp.PickValueInList(INV)
    # the reference runs first on the very same arrays (same layouts), then the
    # inputs are restored and the compiled core runs on them
    saved = [a.copy() for a in arrays]
    want = outcome(ref.unscale_, arrays, inv)
    wrote = [a.copy() for a in arrays]
    for a, s in zip(arrays, saved, strict=True):
        a[...] = s
    got = outcome(lscore.unscale_, arrays, inv)
    if got != want:
        raise AssertionError(f"unscale_: got {got}, reference {want}: inv {inv} {saved!r}")
    for x, y in zip(arrays, wrote, strict=True):
        if (x.dtype.kind == "f" or x.dtype in EXTRA) and not same_bits(x, y):
            raise AssertionError(f"unscale_ wrote {x!r}, reference {y!r}, inv {inv}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
