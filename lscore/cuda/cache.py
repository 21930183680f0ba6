"""The disk cache of compiled kernels: one NVRTC compile per machine, not per process,
device and rank (``kernel_image``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import warnings

from lscore.cuda import nvrtc, sources

__all__ = ["CACHE_DIR_ENV", "CACHE_ENV", "kernel_cache_dir", "kernel_image"]

#: the environment variable naming the folder of the kernel cache
CACHE_DIR_ENV = "LSCORE_KERNEL_CACHE_DIR"
#: the environment variable that turns the kernel cache off (0 or off) or on (1 or on)
CACHE_ENV = "LSCORE_KERNEL_CACHE"
_FORMAT = 1
# an entry: magic, payload length (uint64), SHA-256 of the payload, then the payload: the
# lowered names as JSON (its length a uint32 first) and the image.  A file whose length or
# digest does not match (truncated by a crash, damaged) is compiled again, never loaded.
_MAGIC = b"lsckrn1\n"
_HEAD = struct.Struct("<8sQ32s")
_NAMES = struct.Struct("<I")
_OFF = ("0", "off", "false", "no")
_ON = ("", "1", "on", "true", "yes")


def kernel_cache_dir() -> str | None:
    """The directory of the compiled-kernel cache, or None when ``LSCORE_KERNEL_CACHE=0``.

    ``LSCORE_KERNEL_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/lscore/kernels``, else
    ``~/.cache/lscore/kernels``.  ValueError, naming the variable, for a value of
    ``LSCORE_KERNEL_CACHE`` other than 0/1 (off/on).
    """
    switch = os.environ.get(CACHE_ENV, "")
    if switch.strip().lower() in _OFF:
        return None
    if switch.strip().lower() not in _ON:
        raise ValueError(f"{CACHE_ENV} must be 0 or 1 (off or on), got {switch!r}")
    where = os.environ.get(CACHE_DIR_ENV)
    if where:
        return os.path.abspath(os.path.expanduser(where))
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG rule: a relative path is ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lscore", "kernels")


def _target(arch: str | None) -> tuple[str, str, str]:
    """(architecture, NVRTC's -arch option, "cubin" or "ptx"): what CuPy compiles for `arch`.

    CuPy makes this choice (the device's capability capped at the newest this NVRTC
    knows; PTX under ``CUPY_COMPILE_WITH_PTX``) in these two functions; the cache key
    takes their answer, so a cached image is the one ``compile_kernels`` would give.
    """
    from cupy.cuda import compiler

    if arch is None:
        arch = compiler._get_arch()
    option, kind = compiler._get_arch_for_options_for_nvrtc(arch)
    return str(arch), option, kind


def _cache_key(name: str, text: str, target: tuple[str, str, str]) -> str:
    """SHA-256 of everything the image depends on: source text, options, target, NVRTC."""
    import cupy
    from cupy.cuda import compiler

    material = {
        "format": _FORMAT,
        "file": name,
        "source": text,
        "options": list(nvrtc.NVRTC_OPTIONS),
        "names": list(sources.KERNELS[name]),
        "target": list(target),
        "nvrtc": list(compiler._get_nvrtc_version()),
        "cupy": cupy.__version__,  # the options compile_using_nvrtc adds are CuPy's
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _read_entry(path: str) -> tuple[bytes, dict] | None:
    """(image, lowered names) of the entry at `path`, or None: missing, short or damaged."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < _HEAD.size + _NAMES.size:
        return None
    magic, size, digest = _HEAD.unpack_from(data)
    payload = data[_HEAD.size :]
    if magic != _MAGIC or len(payload) != size or hashlib.sha256(payload).digest() != digest:
        return None
    (n,) = _NAMES.unpack_from(payload)
    try:
        lowered = json.loads(payload[_NAMES.size : _NAMES.size + n])
    except ValueError:
        return None
    if not isinstance(lowered, dict):
        return None
    return payload[_NAMES.size + n :], lowered


def _private_dirs(path: str) -> None:
    """Create `path` and its missing parents, each open to the user alone (0o700)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # another process made it first
        os.chmod(d, 0o700)  # whatever the umask


def _write_entry(path: str, image: bytes, lowered: dict) -> None:
    """Write an entry atomically: a private temporary file in the same directory, then
    ``os.replace``, so a reader (another rank starting at the same time) sees the whole
    entry or none."""
    names = json.dumps(lowered, sort_keys=True).encode()
    payload = _NAMES.pack(len(names)) + names + image
    data = _HEAD.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload
    directory = os.path.dirname(path)
    _private_dirs(directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")  # mode 0o600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def kernel_image(
    name: str, arch: str | None = None, *, refresh: bool = False
) -> tuple[bytes, dict, bool]:
    """The image of ``_ext/<name>`` and its lowered names, compiled once per machine:
    ``(image, {name expression: lowered name}, whether it came from the cache)``.

    The cache (``kernel_cache_dir()``) holds one file per source text, NVRTC options,
    architecture (`arch`; None: the current device's, as ``compile_kernels``), NVRTC and
    CuPy version, so a second process, device or rank compiles nothing.  A missing,
    truncated or damaged entry (and any entry, with `refresh`) is compiled by
    ``compile_kernels`` and written.  A cache that cannot be written warns and compiles.
    """
    text = sources.source(name)
    target = _target(arch)
    directory = kernel_cache_dir()
    path = None
    if directory is not None:
        path = os.path.join(directory, f"{name}-{_cache_key(name, text, target)}")
        hit = None if refresh else _read_entry(path)
        if hit is not None:
            return hit[0], hit[1], True
    image, lowered, _ = nvrtc.compile_kernels(name, target[0])
    if path is not None:
        try:
            _write_entry(path, image, dict(lowered))
        except OSError as e:
            warnings.warn(
                f"lscore could not write its kernel cache ({e}); the kernels will be "
                f"compiled again by the next process: set {CACHE_DIR_ENV} to a writable "
                f"directory, or {CACHE_ENV}=0",
                RuntimeWarning,
                stacklevel=2,
            )
    return image, dict(lowered), False
