"""The disk cache of compiled kernels (lscore.cuda.kernel_image): one NVRTC compile per machine.

Compiles are counted where CuPy calls NVRTC (``nvrtcCompileProgram``), so a
test sees every real compile.  The `cupy_compiler` fixture stands in for
CuPy's one device query (here: a cubin for the architecture asked), which is
all that needs a GPU; the driver's load of an image (``module``) is stood in
for by a fake module only where a test needs a load to fail.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings

import pytest

from lscore import cuda
from lscore.cuda import cache, cupy_backend, nvrtc, sources

SMALL = "update.cu"  # the quickest file to compile


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> str:
    where = str(tmp_path / "kernels")
    monkeypatch.setenv(cuda.CACHE_DIR_ENV, where)
    monkeypatch.delenv(cuda.CACHE_ENV, raising=False)
    return where


@pytest.fixture
def compiles(cupy_compiler, monkeypatch, cache_dir) -> list:
    """The NVRTC compiles made while the test runs (one entry each: the -arch option)."""
    monkeypatch.setattr(
        cupy_compiler,
        "_get_arch_for_options_for_nvrtc",
        lambda arch=None: (f"-arch=sm_{arch}", "cubin"),
    )
    seen: list = []
    compile_program = cupy_compiler.nvrtc.compileProgram

    def counting(prog, options):
        seen.append(next(o for o in options if o.startswith("-arch=")))
        return compile_program(prog, options)

    monkeypatch.setattr(cupy_compiler.nvrtc, "compileProgram", counting)
    return seen


def entries(directory: str) -> list[str]:
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def test_a_second_call_reads_the_entry_the_first_wrote(compiles, cache_dir):
    image, lowered, cached = cuda.kernel_image(SMALL, "90")
    assert (cached, compiles) == (False, ["-arch=sm_90"])
    assert image[:4] == b"\x7fELF" and set(lowered) == set(cuda.KERNELS[SMALL])
    assert len(entries(cache_dir)) == 1 and entries(cache_dir)[0].startswith(SMALL + "-")
    again = cuda.kernel_image(SMALL, "90")
    assert again == (image, lowered, True)
    assert len(compiles) == 1


SCRIPT = """
import json
from cupy.cuda import compiler
compiler._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch=sm_{arch}", "cubin")
compiles = []
compile_program = compiler.nvrtc.compileProgram
def counting(prog, options):
    compiles.append(1)
    return compile_program(prog, options)
compiler.nvrtc.compileProgram = counting
from lscore import cuda
cached = [cuda.kernel_image(name, "90")[2] for name in sorted(cuda.KERNELS)]
print(json.dumps({"compiles": len(compiles), "cached": cached}))
"""


@pytest.mark.slow
def test_a_second_process_compiles_nothing(cupy_compiler, cache_dir):
    """Every kernel file, compiled by one process start and read by the next."""
    env = {**os.environ, cuda.CACHE_DIR_ENV: cache_dir}
    env.pop(cuda.CACHE_ENV, None)

    def start() -> dict:
        r = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    n = len(cuda.KERNELS)
    assert start() == {"compiles": n, "cached": [False] * n}
    assert start() == {"compiles": 0, "cached": [True] * n}
    assert len(entries(cache_dir)) == n


@pytest.mark.parametrize(
    "change",
    ["source text", "options", "architecture", "nvrtc version", "ptx instead of cubin"],
)
def test_each_part_of_the_key_has_its_own_entry(compiles, cache_dir, monkeypatch, change):
    first = cuda.kernel_image(SMALL, "90")
    arch = "90"
    if change == "source text":
        read = sources._read
        monkeypatch.setattr(
            sources, "_read", lambda name: read(name) + ("\n// edited\n" if name == SMALL else "")
        )
    elif change == "options":
        monkeypatch.setattr(nvrtc, "NVRTC_OPTIONS", (*nvrtc.NVRTC_OPTIONS, "-DLSC_EDITED=1"))
    elif change == "architecture":
        arch = "80"
    elif change == "nvrtc version":
        from cupy.cuda import compiler

        monkeypatch.setattr(compiler, "_get_nvrtc_version", lambda: (99, 0))
    else:
        from cupy.cuda import compiler

        monkeypatch.setattr(
            compiler,
            "_get_arch_for_options_for_nvrtc",
            lambda arch=None: (f"-arch=compute_{arch}", "ptx"),
        )
    second = cuda.kernel_image(SMALL, arch)
    assert second[2] is False and len(compiles) == 2
    assert len(entries(cache_dir)) == 2
    if change in ("architecture", "ptx instead of cubin"):
        assert second[0] != first[0]
    assert cuda.kernel_image(SMALL, arch)[2] is True and len(compiles) == 2


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip_a_byte(data: bytes) -> bytes:
    i = len(data) - 100
    return data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1 :]


def _header_only(data: bytes) -> bytes:
    return data[:48]


def _foreign(data: bytes) -> bytes:
    return b"\x7fELF" + data[4:]


@pytest.mark.parametrize(
    "damage",
    [_truncate, _flip_a_byte, _header_only, _foreign, lambda data: b""],
    ids=["truncated", "a byte flipped", "header only", "another format", "empty"],
)
def test_a_damaged_entry_is_compiled_again_not_trusted(compiles, cache_dir, damage):
    image, lowered, _ = cuda.kernel_image(SMALL, "90")
    (name,) = entries(cache_dir)
    path = os.path.join(cache_dir, name)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(damage(data))
    assert cuda.kernel_image(SMALL, "90") == (image, lowered, False)
    assert len(compiles) == 2
    with open(path, "rb") as f:
        assert f.read() == data  # the entry is whole again
    assert cuda.kernel_image(SMALL, "90")[2] is True and len(compiles) == 2


class _Device:
    """cupy.cuda.Device's context manager, for the one device a test pretends to have."""

    def __init__(self, device: int):
        self.id = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fake_driver(monkeypatch, refuse) -> list:
    """Stand in for the device and the driver's module load; loads `refuse(image)` rejects
    raise.  Returns the images loaded."""
    import cupy
    from cupy.cuda import compiler, function

    loaded: list = []

    class Module:
        def load(self, image: bytes) -> None:
            if refuse(image):
                raise RuntimeError("CUDA_ERROR_INVALID_IMAGE")
            loaded.append(image)

    monkeypatch.setattr(cupy.cuda, "Device", _Device)
    monkeypatch.setattr(function, "Module", Module)
    monkeypatch.setattr(compiler, "_get_arch", lambda: "90")
    monkeypatch.setattr(cupy_backend, "_modules", {})
    return loaded


def test_an_entry_the_driver_refuses_is_compiled_again(compiles, cache_dir, monkeypatch):
    image, lowered, _ = cuda.kernel_image(SMALL, "90")
    (name,) = entries(cache_dir)
    path = os.path.join(cache_dir, name)
    cache._write_entry(path, b"an image from a newer NVRTC", lowered)  # checksum intact
    loaded = _fake_driver(monkeypatch, lambda img: img == b"an image from a newer NVRTC")
    assert cupy_backend.module(SMALL, 0)[1] == lowered
    assert loaded == [image] and len(compiles) == 2
    assert cache._read_entry(path) == (image, lowered)


def test_a_fresh_image_the_driver_refuses_raises(compiles, cache_dir, monkeypatch):
    _fake_driver(monkeypatch, lambda img: True)
    with pytest.raises(RuntimeError, match="INVALID_IMAGE"):
        cupy_backend.module(SMALL, 0)
    assert len(compiles) == 1


def test_the_cache_is_private_to_the_user(compiles, tmp_path, monkeypatch):
    """Every folder the cache creates is 0o700 and every entry 0o600, whatever the umask."""
    monkeypatch.delenv(cuda.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    old = os.umask(0)
    try:
        cuda.kernel_image(SMALL, "90")
    finally:
        os.umask(old)
    where = cuda.kernel_cache_dir()
    assert where == str(tmp_path / "xdg" / "lscore" / "kernels")
    for folder in (
        tmp_path / "xdg",
        tmp_path / "xdg" / "lscore",
        tmp_path / "xdg" / "lscore" / "kernels",
    ):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
    (name,) = entries(where)
    assert stat.S_IMODE(os.stat(os.path.join(where, name)).st_mode) == 0o600


def test_an_existing_folder_keeps_its_mode(compiles, cache_dir):
    os.makedirs(cache_dir, mode=0o755)
    os.chmod(cache_dir, 0o755)
    cuda.kernel_image(SMALL, "90")
    assert stat.S_IMODE(os.stat(cache_dir).st_mode) == 0o755


@pytest.mark.parametrize("value", ["0", "off", "OFF", "false"])
def test_the_switch_turns_the_cache_off(compiles, cache_dir, monkeypatch, value):
    monkeypatch.setenv(cuda.CACHE_ENV, value)
    assert cuda.kernel_cache_dir() is None
    assert cuda.kernel_image(SMALL, "90")[2] is False
    assert cuda.kernel_image(SMALL, "90")[2] is False
    assert len(compiles) == 2 and not os.path.exists(cache_dir)


@pytest.mark.parametrize("value", ["", "1", "on"])
def test_the_switch_on(cache_dir, monkeypatch, value):
    monkeypatch.setenv(cuda.CACHE_ENV, value)
    assert cuda.kernel_cache_dir() == cache_dir


def test_a_bad_switch_names_the_variable(monkeypatch):
    monkeypatch.setenv(cuda.CACHE_ENV, "sometimes")
    with pytest.raises(ValueError, match=r"LSCORE_KERNEL_CACHE must be 0 or 1 .*'sometimes'"):
        cuda.kernel_cache_dir()


def test_where_the_cache_lives(tmp_path, monkeypatch):
    monkeypatch.delenv(cuda.CACHE_ENV, raising=False)
    monkeypatch.delenv(cuda.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cuda.kernel_cache_dir() == str(tmp_path / "home" / ".cache" / "lscore" / "kernels")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert cuda.kernel_cache_dir() == str(tmp_path / "home" / ".cache" / "lscore" / "kernels")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cuda.kernel_cache_dir() == str(tmp_path / "xdg" / "lscore" / "kernels")
    monkeypatch.setenv(cuda.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert cuda.kernel_cache_dir() == str(tmp_path / "mine")


def test_a_failed_write_leaves_no_partial_file(compiles, cache_dir, monkeypatch):
    """The entry appears whole (os.replace) or not at all; the temporary file goes."""
    image, lowered, _ = cuda.kernel_image(SMALL, "90")
    (name,) = entries(cache_dir)
    path = os.path.join(cache_dir, name)

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        cache._write_entry(path, b"half", lowered)
    assert entries(cache_dir) == [name]
    assert cache._read_entry(path) == (image, lowered)


def test_a_cache_that_cannot_be_written_warns_and_compiles(compiles, tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_bytes(b"")
    monkeypatch.setenv(cuda.CACHE_DIR_ENV, str(blocker / "kernels"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image, _, cached = cuda.kernel_image(SMALL, "90")
    assert cached is False and image[:4] == b"\x7fELF" and len(compiles) == 1
    (w,) = caught
    assert w.category is RuntimeWarning and "LSCORE_KERNEL_CACHE_DIR" in str(w.message)
