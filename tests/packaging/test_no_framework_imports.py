"""`import lscore` leaves torch, cupy and the optional packages out of sys.modules."""

import ast
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

HEAVY = (
    "torch",
    "cupy",
    "mpi4py",
    "ml_dtypes",
    "matplotlib",
    "sklearn",
    "tqdm",
    "jax",
    "tensorflow",
)


def test_import_lscore_pulls_in_no_framework(tmp_path):
    code = (
        "import sys, numpy as np, lscore\n"
        "lscore.all_finite([np.ones(3)]); lscore.unscale_(np.ones(3), 0.5)\n"
        "ls = lscore.DynamicLossScale(); ls.update([np.ones(2)])\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def _top_level_imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


def test_core_modules_have_no_top_level_framework_import():
    offenders = []
    for folder in ("lscore", "_ext"):
        for path in sorted((ROOT / folder).glob("*.py")):
            bad = [m for m in _top_level_imports(path) if m in HEAVY]
            if bad:
                offenders.append((path.name, bad))
    assert offenders == []
