"""Install layout: lscore._ext, lscore.adapters and lscore.bench import; top-level _ext /
adapters / benchmarks do not;
the licence travels in the wheel and the sdist."""

import os
import subprocess
import sys
import tarfile
import zipfile

import pytest

from helpers import ROOT, built_wheel

# these build from the checkout without isolation, so the environment needs lscore's build
# requirements; cibuildwheel's test environment has the built wheel and not them
BUILD_REQUIREMENTS = "building from the checkout needs Cython and setuptools here"


def run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_every_package_of_the_tree_is_listed():
    """pyproject's packages list every folder with an __init__.py (a missing one is left out
    of the wheel and of a strict editable install)."""
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    found = set()
    for name, folder in conf["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found <= listed, sorted(found - listed)


def test_subpackages_import_from_elsewhere(tmp_path):
    r = run(
        "import lscore, lscore._ext._scan, lscore._ext._state, lscore.adapters, lscore.bench; "
        "print(lscore.__file__)",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr


def test_every_package_folder_is_listed_for_the_wheel():
    """pyproject lists the packages setuptools puts in the wheel: a folder of lscore/ with
    an __init__.py that the list misses would be left out of every install."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(("lscore", *p.parent.relative_to(ROOT / "lscore").parts))
        for p in (ROOT / "lscore").rglob("__init__.py")
    }
    assert found - listed == set()


@pytest.mark.parametrize("name", ["_ext", "adapters", "benchmarks"])
def test_no_top_level_packages(tmp_path, name):
    r = run(f"import {name}", tmp_path)
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr


@pytest.mark.slow
def test_wheel_installs_and_imports_in_fresh_venv(tmp_path):
    """Install the wheel into a fresh virtualenv and import it from another folder.  The wheel
    is the one under test (`make wheel`'s in dist/, or LSCORE_WHEEL's): CI builds it once and
    every step uses it.  Without one it is built here, at -O1 (setup.py's LSCORE_OPT): what the
    wheel holds does not depend on the level."""
    wheel = built_wheel()
    if wheel is None:
        pytest.importorskip("Cython", reason=BUILD_REQUIREMENTS)
        wheel_dir = tmp_path / "wheels"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(wheel_dir),
                str(ROOT),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "LSCORE_OPT": "-O1"},
        )
        assert r.returncode == 0, r.stdout + r.stderr
        wheel = next(wheel_dir.glob("lscore-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("lscore/_ext/_scan") and n.endswith(".so") for n in names)
    assert any(n.startswith("lscore/_ext/_state") and n.endswith(".so") for n in names)
    assert "lscore/_ext/lsc_state.h" in names and "lscore/adapters/__init__.py" in names
    assert "lscore/bench/__init__.py" in names and "lscore/bench/_harness.py" in names
    assert not any(n.endswith((".pyx", ".c")) for n in names)
    assert not any(n.split("/")[0] in ("_ext", "adapters", "benchmarks") for n in names)
    # PEP 639: the licence file in the wheel's metadata, named in METADATA
    assert "lscore-0.1.0.dist-info/licenses/LICENSE" in names
    wheel_license = zipfile.ZipFile(wheel).read("lscore-0.1.0.dist-info/licenses/LICENSE")
    assert wheel_license == (ROOT / "LICENSE").read_bytes()
    metadata = zipfile.ZipFile(wheel).read("lscore-0.1.0.dist-info/METADATA").decode()
    assert "License-File: LICENSE" in metadata and "License-Expression: Apache-2.0" in metadata
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    numpy_req = "numpy"
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", numpy_req, str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        [
            str(py),
            "-P",
            "-c",
            "import lscore, numpy as np; "
            "assert not lscore.all_finite([np.array([1.0, float('nan')])]); "
            "print(lscore.__file__)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert str(venv) in r.stdout


def test_sdist_carries_the_license(tmp_path):
    """The sdist (setuptools' PEP 517 hook, as `python -m build --sdist` calls it) holds
    LICENSE at its root, byte for byte, and its metadata names it."""
    pytest.importorskip("Cython", reason=BUILD_REQUIREMENTS)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; "
            "print(build_meta.build_sdist(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    sdist = tmp_path / r.stdout.split()[-1]
    with tarfile.open(sdist) as tar:
        top = sdist.name.removesuffix(".tar.gz")
        licence = tar.extractfile(f"{top}/LICENSE")
        assert licence is not None and licence.read() == (ROOT / "LICENSE").read_bytes()
        pkg_info = tar.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None and "License-File: LICENSE" in pkg_info.read().decode()
