"""Every Python example in README.md runs as written."""

import re
import subprocess
import sys

import pytest

from helpers import ROOT
from lscore import cuda

README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
NEEDS = {
    "torch": "torch",
    "cupy": "cupy",
    "mpi4py": "mpi4py",
    "ml_dtypes": "ml_dtypes",
    "lightning": "lightning",
    "accelerate": "accelerate",
}


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, tmp_path):
    for mod, pkg in NEEDS.items():
        if re.search(rf"^\s*(import|from)\s+{mod}\b|lscore\.adapters\.{mod}\b", code, flags=re.M):
            pytest.importorskip(pkg)
            if mod == "cupy" and cuda.device_missing() is not None:
                pytest.skip(f"a CuPy example: {cuda.device_missing()}")
    if "dist.init_process_group" in code or "mpirun" in code:
        pytest.skip("distributed example: run by the multi-process tests")
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr


def test_readme_has_examples():
    assert len(BLOCKS) >= 2
