"""Extension list of lscore's compiled core, and the long description; the rest of the
metadata lives in pyproject.toml."""

import os
import platform
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# x86-64-v2 is the portable baseline; faster kernels are picked at run time (the levels
# of _ext/lsc_isa.h).  No -ffast-math: the state machine and the unscale must round
# exactly as the peers do.  -g0: no debug information, which made the modules tens of
# megabytes.  LSCORE_OPT sets the optimisation level (-O3 by default; -O1 builds in a
# fraction of the time where the CPU kernels' speed does not matter, as in
# scripts/gpu_check.sh on a short GPU lease).
OPT = os.environ.get("LSCORE_OPT", "-O3")
if not re.fullmatch(r"-O[0-3s]", OPT):
    raise SystemExit(f"LSCORE_OPT must be -O0, -O1, -O2, -O3 or -Os, got {OPT!r}")
FLAGS = [OPT, "-g0", "-fno-strict-aliasing", "-ffp-contract=off"]
if platform.machine() in ("x86_64", "AMD64"):
    FLAGS.append("-march=x86-64-v2")

# lsc_isa.h's levels where the compiler builds them (x86-64, GCC >= 12), each with the
# target flags its unit is compiled with; elsewhere one baseline level.
X86_LEVELS = {
    "v2": ["-march=x86-64-v2"],
    "v3": ["-march=x86-64-v3"],
    "v4": ["-march=x86-64-v4", "-mprefer-vector-width=512"],
}
# extension -> its kernel units, compiled once per level with -DLSC_LEVEL=<level>
LEVEL_SOURCES = {"_mx": ["_ext/lsc_mx_kern.c"], "_nvfp4": ["_ext/lsc_nvfp4_kern.c"]}
HEADERS = sorted(str(h) for h in Path("_ext").glob("*.h"))
# compiles only where lsc_isa.h has the x86-64 levels
LEVELS_PROBE = '#include "lsc_isa.h"\n#ifndef LSC_X86_DISPATCH\n#error one level\n#endif\n'


def ext(name):
    return Extension(
        f"lscore._ext.{name}",
        [f"_ext/{name}.pyx"],
        include_dirs=["_ext", numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=FLAGS,
        # a change to a kernel unit or a header rebuilds the units and relinks
        depends=LEVEL_SOURCES[name] + HEADERS if name in LEVEL_SOURCES else [],
    )


class build_ext_levels(build_ext):
    """build_ext that first compiles the kernel units of every extension, once per ISA
    level with that level's flags, all of them at once, and links each level's object
    into its extension (NumPy's *.dispatch.c sources, without the generator)."""

    def levels(self):
        """X86_LEVELS when this compiler gets lsc_isa.h's x86-64 levels, else one baseline."""
        probe = Path(self.build_temp, "lsc_levels_probe.c")
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text(LEVELS_PROBE)
        try:
            self.compiler.compile([str(probe)], output_dir=self.build_temp, include_dirs=["_ext"])
        except CompileError:
            return {"baseline": []}
        return X86_LEVELS

    def build_extensions(self):
        levels = self.levels()
        units = []  # (extension, source, level, flags)
        for e in self.extensions:
            for source in LEVEL_SOURCES.get(e.name.rsplit(".", 1)[1], []):
                units += [(e, source, level, flags) for level, flags in levels.items()]

        def compile_unit(unit):
            e, source, level, flags = unit
            out = os.path.join(self.build_temp, level)
            obj = self.compiler.object_filenames([source], output_dir=out)[0]
            newest = max(os.path.getmtime(p) for p in [source, *HEADERS])
            if self.force or not os.path.exists(obj) or os.path.getmtime(obj) < newest:
                self.compiler.compile(
                    [source],
                    output_dir=out,
                    include_dirs=e.include_dirs,
                    macros=[("LSC_LEVEL", level)],
                    extra_postargs=FLAGS + flags,
                )
            return e, obj

        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for e, obj in pool.map(compile_unit, units):
                e.extra_objects.append(obj)
        super().build_extensions()


def long_description():
    """README.md with its links to docs/ pages made absolute, against the documentation site
    that pyproject.toml's [project.urls] names: an index page has no docs/ folder beside it.
    A relative link to anything but a docs/ page has no address there and fails the build."""
    urls = tomllib.loads(Path("pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]
    base = urls["Documentation"].rstrip("/") + "/"

    def absolute(match):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:|#", target):  # a URL, or an anchor of the page itself
            return match.group(0)
        page = re.fullmatch(r"docs/([^#]+)\.md(#.*)?", target)
        if page is None:
            raise SystemExit(
                f"README.md links to {target!r}, which has no address on the documentation "
                "site; link a docs/ page or an absolute URL"
            )
        return f"]({base}{page.group(1)}.html{page.group(2) or ''})"

    return re.sub(r"\]\(([^)\s]+)\)", absolute, Path("README.md").read_text(encoding="utf-8"))


setup(
    ext_modules=cythonize(
        [
            ext("_mx"),  # the longest compile (minutes under the sanitizers) starts first
            ext("_nvfp4"),
            ext("_codes"),
            ext("_state"),
            ext("_scan"),
            ext("_walk"),
            ext("_pack"),
            ext("_grads"),
            ext("_fp8"),
            ext("_fp8_scale"),
        ],
        include_path=["_ext"],
        compiler_directives={"language_level": 3},
        nthreads=os.cpu_count() or 1,
    ),
    cmdclass={"build_ext": build_ext_levels},
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    long_description=long_description(),
    long_description_content_type="text/markdown",
)
