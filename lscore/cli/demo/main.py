"""``lscore demo``'s run: the settings, the checks of the output folder, the backend's
training of each mode, then the table, the figure and the JSON."""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections.abc import Iterable
from typing import Any

import numpy as np

from lscore.cli.demo import model, report

# backend name -> the module that trains one mode with it (each has DESCRIPTION and train)
BACKENDS = {
    "numpy": "lscore.cli.demo.numpy_backend",
    "torch": "lscore.cli.demo.torch_backend",
    "cupy": "lscore.cli.demo.cupy_backend",
}


def check_out(out: str, names: tuple[str, ...] = ()) -> None:
    """Make folder `out` if missing and check that the demo's files can be written there,
    before any training (`names`: the files it writes, the float16 demo's by default);
    ValueError saying why not."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{out} is a file; expected a folder")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot make folder {out}: {e.strerror or e}") from None
    for name in names or OUTPUTS:
        if os.path.isdir(os.path.join(out, name)):
            raise ValueError(f"{os.path.join(out, name)} is a folder; the demo writes a file there")
    try:
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise ValueError(f"cannot write in {out}: {e.strerror or e}") from None


OUTPUTS = ("lscore_demo.png", "lscore_demo.json")
FP8_OUTPUTS = ("lscore_demo_fp8.png", "lscore_demo_fp8.json")  # with --fp8


def run(
    steps: int | None = None,
    seed: int = 0,
    out: str = ".",
    backend: str = "numpy",
    tiny: bool = False,
    fp8: bool = False,
    full: bool = False,
) -> int:
    """Train the three modes (with `fp8`, bfloat16 and the two FP8 ones), print the table,
    write the PNG and the JSON; returns an exit code."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected numpy, torch or cupy")
    if fp8 and backend != "numpy":
        raise ValueError(f"--fp8 runs on the numpy backend, got backend {backend!r}")
    names = FP8_OUTPUTS if fp8 else OUTPUTS
    check_out(out, names)
    from threadpoolctl import threadpool_limits

    # more BLAS threads than this small model needs only add overhead; the limit is
    # lifted on return, so a caller in the same process keeps its own thread counts
    with threadpool_limits(1):
        return _train(steps, seed, out, backend, tiny, fp8, names, full)


def _train(
    steps: int | None,
    seed: int,
    out: str,
    backend: str,
    tiny: bool,
    fp8: bool,
    names: tuple[str, str],
    full: bool = False,
) -> int:
    """run's work under its thread limit: train the modes, print, write the outputs."""
    from tqdm import tqdm

    cfg = model.config(steps, seed, tiny, full)
    data = model.load_data(cfg)
    model0 = model.LM(cfg, np.random.default_rng(seed))

    def progress(it: Iterable[int], desc: str) -> Iterable[int]:
        return tqdm(it, desc=desc, leave=True, mininterval=0.3)

    if backend == "cupy":
        from lscore.cli.demo import cupy_backend

        missing = cupy_backend.gpu_missing()
        if missing is not None:
            print(
                f"lscore demo --backend cupy needs a CUDA GPU: {missing}; "
                "running the CPU demo instead.\n"
            )
            backend = "numpy"
    module: Any = importlib.import_module(BACKENDS[backend])
    modes = model.MODES
    if fp8:
        from lscore.cli.demo import fp8 as module

        modes = module.FP8_MODES
    print(module.DESCRIPTION + "\n")
    if backend != "numpy":
        cfg["backend"] = backend
    records = [module.train(m, model0, data, cfg, progress) for m in modes]
    print()
    png, js = (os.path.join(out, name) for name in names)
    if fp8:
        print(module.table(records))
        for r in records[1:]:
            print(f"\n{r['mode']} ({r['recipe']}), the casts at the last step:\n{r['last_table']}")
        module.plot(records, png, cfg)
    else:
        print(report.table(records))
        print(report.summary(records))
        report.plot(records, png, cfg)
    with open(js, "w") as f:
        json.dump(
            {
                "config": cfg,
                "results": [
                    {k: v for k, v in r.items() if k not in ("loss", "scale", "last_table")}
                    for r in records
                ],
            },
            f,
            indent=1,
        )
    print(f"\nplot: {os.path.abspath(png)}\nresults: {os.path.abspath(js)}")
    return 0
