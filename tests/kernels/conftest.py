"""The kernel folder's fixtures: CuPy's NVRTC path without a GPU."""

import importlib.resources
import os

import pytest


@pytest.fixture
def ext_dir():
    """The kernels' own include directory: lscore._ext of the package under test, where
    lscore.cuda reads the kernel sources (the checkout's _ext/ in an editable install)."""
    return str(importlib.resources.files("lscore._ext"))


@pytest.fixture
def cupy_compiler(monkeypatch):
    """cupy.cuda.compiler, with its one device query replaced by a fixed target.

    compile_using_nvrtc asks the driver for the current device even when
    `arch` is given (to choose cubin or PTX), which fails without a GPU.
    The stand-in answers PTX for the given architecture; every other step
    (option assembly, NVRTC, name expressions, the log) is CuPy's own.
    """
    try:
        from cupy.cuda import compiler
    except ImportError as e:  # pragma: no cover - the test extra installs it
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cupy is not installed ({e}); pip install -e '.[test]'")
    monkeypatch.setattr(
        compiler,
        "_get_arch_for_options_for_nvrtc",
        lambda arch=None: (f"-arch=compute_{arch}", "ptx"),
    )
    return compiler
