"""Extension list of lscore's compiled core; metadata lives in pyproject.toml."""

import platform

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# x86-64-v2 is the portable baseline; faster kernels are picked at run time
# (#pragma GCC target copies in _ext/lsc_scan.h).  No -ffast-math: the state machine and
# the unscale must round exactly as the peers do.
FLAGS = ["-O3", "-fno-strict-aliasing", "-ffp-contract=off"]
if platform.machine() in ("x86_64", "AMD64"):
    FLAGS.append("-march=x86-64-v2")


def ext(name):
    return Extension(
        f"lscore._ext.{name}",
        [f"_ext/{name}.pyx"],
        include_dirs=["_ext", numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=FLAGS,
    )


setup(
    ext_modules=cythonize(
        [ext("_codes"), ext("_state"), ext("_scan"), ext("_walk"), ext("_grads"), ext("_fp8")],
        include_path=["_ext"],
        compiler_directives={"language_level": 3},
    )
)
