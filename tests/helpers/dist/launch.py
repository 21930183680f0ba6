"""Start worker processes on 127.0.0.1 and always get control back.

Every launch has a deadline: a worker still running at the deadline is killed
with its whole process group and the test fails with the workers' output.
Output goes to files (not pipes) so a chatty rank can never block on a full
pipe while its peers wait for it in a collective.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers import ROOT, TESTS

WORKERS = TESTS / "distributed" / "dist_workers"  # the scripts each rank runs


class LaunchTimeout(AssertionError):
    """A launch passed its deadline; its processes were killed."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and anything it started
        except ProcessLookupError:
            pass
    proc.wait()


def _env() -> dict:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    # the workers import helpers.dist.scenarios
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    return env


def run(cmds: list[list[str]], out_dir: Path, timeout: float, envs: list[dict] | None = None):
    """Run `cmds` concurrently; returns [(returncode, output)], or raises LaunchTimeout."""
    out_dir.mkdir(parents=True, exist_ok=True)
    procs, logs = [], []
    try:
        for i, cmd in enumerate(cmds):
            log = open(out_dir / f"proc{i}.log", "w+")
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=envs[i] if envs else _env(),
                    cwd=out_dir,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout
        timed_out = False
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for proc in procs:
            _kill(proc)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    if timed_out:
        raise LaunchTimeout(
            f"workers still running after {timeout} s, killed:\n"
            + "\n---\n".join(o[-3000:] for o in outputs)
        )
    return [(p.returncode, o) for p, o in zip(procs, outputs)]


def results(out_dir: Path, world: int) -> list[dict]:
    """The JSON record each rank wrote."""
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def torch_run(
    mode: str, out_dir: Path, world: int = 2, backend: str = "gloo", timeout: float = 240.0
):
    """`world` torch_worker.py ranks over a fresh TCP rendezvous on 127.0.0.1."""
    port = str(free_port())
    cmds = [
        [
            sys.executable,
            str(WORKERS / "torch_worker.py"),
            mode,
            str(r),
            str(world),
            port,
            str(out_dir),
            backend,
        ]
        for r in range(world)
    ]
    return run(cmds, out_dir, timeout)


def torchrun_like(
    script: Path,
    out_dir: Path,
    world: int = 2,
    timeout: float = 240.0,
    args: list[str] | None = None,
):
    """`script args...` on `world` ranks with the environment torchrun gives (env:// rendezvous)."""
    port = str(free_port())
    envs = [
        dict(
            _env(),
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        for r in range(world)
    ]
    return run([[sys.executable, str(script), *(args or [])]] * world, out_dir, timeout, envs)


def doc_examples(marker: str) -> list[tuple[str, list[str]]]:
    """The Python blocks of docs/guides/distributed.md that contain `marker`.

    Each comes with the ```text blocks after it, up to the next Python block: what its
    ranks print, one line per rank and step, sorted.
    """
    text = (ROOT / "docs" / "guides" / "distributed.md").read_text()
    found = re.finditer(r"```python\n(.*?)```(.*?)(?=```python|\Z)", text, flags=re.S)
    return [
        (m.group(1), re.findall(r"```text\n(.*?)```", m.group(2), flags=re.S))
        for m in found
        if marker in m.group(1)
    ]


def rank_lines(*outputs: str) -> dict[int, list[str]]:
    """{rank: lines} from the "rank R: ..." lines of `outputs`, without the prefix.

    mpirun may glue the lines of two ranks together, so a line ends where the
    next "rank R: " starts.
    """
    lines: dict = {}
    for out in outputs:
        for r, line in re.findall(r"rank (\d+): (.*?)(?=rank \d+: |\n|$)", out):
            lines.setdefault(int(r), []).append(line.strip())
    return lines


def mpirun_command(world: int) -> list[str]:
    """mpirun for `world` local ranks, as root, on however few cores there are."""
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-n",
        str(world),
    ]


def mpi_env() -> dict:
    env = _env()
    # containers usually forbid the cross-memory attach of Open MPI's shared-memory transport
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    return env


def mpi_run(
    mode: str,
    out_dir: Path,
    world: int = 2,
    timeout: float = 120.0,
    mpirun_timeout: int | None = None,
):
    """`mpirun -n world mpi_worker.py mode out_dir`, with mpirun's own timeout inside ours."""
    return mpirun_script(
        WORKERS / "mpi_worker.py", [mode, str(out_dir)], out_dir, world, timeout, mpirun_timeout
    )


def mpirun_script(
    script: Path,
    args: list[str],
    out_dir: Path,
    world: int = 2,
    timeout: float = 120.0,
    mpirun_timeout: int | None = None,
):
    """`mpirun -n world python script args...`; (returncode, combined output)."""
    mpirun_timeout = mpirun_timeout or int(timeout * 0.75)
    cmd = mpirun_command(world) + [
        "--timeout",
        str(mpirun_timeout),
        sys.executable,
        str(script),
        *args,
    ]
    return run([cmd], out_dir, timeout, [mpi_env()])[0]
