"""Install layout: lscore._ext and lscore.adapters import; top-level _ext / adapters do not."""

import subprocess
import sys
import zipfile

import pytest

from helpers import ROOT


def run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_subpackages_import_from_elsewhere(tmp_path):
    r = run(
        "import lscore, lscore._ext._scan, lscore._ext._state, lscore.adapters; "
        "print(lscore.__file__)",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", ["_ext", "adapters"])
def test_no_top_level_packages(tmp_path, name):
    r = run(f"import {name}", tmp_path)
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr


@pytest.mark.slow
def test_wheel_installs_and_imports_in_fresh_venv(tmp_path):
    """Build a wheel, install it into a fresh virtualenv and import it from another folder."""
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
    )
    assert r.returncode == 0, r.stdout + r.stderr
    wheel = next(wheel_dir.glob("lscore-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("lscore/_ext/_scan") and n.endswith(".so") for n in names)
    assert any(n.startswith("lscore/_ext/_state") and n.endswith(".so") for n in names)
    assert "lscore/_ext/lsc_state.h" in names and "lscore/adapters/__init__.py" in names
    assert not any(n.endswith((".pyx", ".c")) for n in names)
    assert not any(n.split("/")[0] in ("_ext", "adapters") for n in names)
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
