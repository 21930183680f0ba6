"""lscore.distributed.MPIReducer under `mpirun -n 2`, and the reducer contract itself.

The multi-process tests run tests/distributed/dist_workers/mpi_worker.py under
``mpirun --allow-run-as-root --oversubscribe -n 2`` with mpirun's --timeout
inside the launcher's own deadline.  `make test` installs Open MPI (apt-get)
and mpi4py; where that is impossible it writes the reason to
<venv>/NO_MPI and these tests skip with it.
"""

import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.dist import checks, launch
from lscore.distributed import MPIReducer, check_reducer, reduce_found_inf

WORLD = 2
CASES = checks.cases(("numpy",))


def _mpi_missing():
    why = Path(sys.prefix, "NO_MPI")
    reason = why.read_text().strip() if why.exists() else None
    if shutil.which("mpirun") is None:
        return reason or "mpirun is not on PATH (make test installs openmpi-bin with apt-get)"
    if importlib.util.find_spec("mpi4py") is None:
        return reason or "mpi4py is not installed (make test installs it after Open MPI)"
    return None


needs_mpi = pytest.mark.skipif(_mpi_missing() is not None, reason=str(_mpi_missing()))


@pytest.fixture(scope="module")
def mpi_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("mpi")
    rc, log = launch.mpi_run("scenarios", out, world=WORLD)
    assert rc == 0, log[-3000:]
    recs = launch.results(out, WORLD)
    assert [(r["rank"], r["size"]) for r in recs] == [(i, WORLD) for i in range(WORLD)]
    return recs


@needs_mpi
@pytest.mark.parametrize("check", list(CASES.values()), ids=list(CASES))
def test_scenario(check, mpi_records):
    check(mpi_records)


@needs_mpi
def test_a_dead_rank_ends_the_job(tmp_path):
    rc, log = launch.mpi_run("die", tmp_path, world=WORLD)
    assert rc != 0 and "exit code" in log.lower(), log[-3000:]
    assert not (tmp_path / "rank0.json").exists()


@needs_mpi
def test_a_hung_rank_ends_the_job_at_the_time_limit(tmp_path):
    rc, log = launch.mpi_run("hang", tmp_path, world=WORLD, mpirun_timeout=5)
    assert rc != 0 and "time limit" in log, log[-3000:]


@needs_mpi
@pytest.mark.parametrize(("code", "shown"), launch.doc_examples("MPI.COMM_WORLD"))
def test_documented_example_under_mpirun(code, shown, tmp_path):
    """docs/guides/distributed.md's MPI example prints what the page shows."""
    script = tmp_path / "train_mpi.py"
    script.write_text(code)
    rc, log = launch.mpirun_script(script, [], tmp_path / "run", world=WORLD)
    assert rc == 0, log[-3000:]
    lines = launch.rank_lines(log)
    assert sorted(lines) == list(range(WORLD)), log
    got = sorted(f"rank {r}: {line}" for r in lines for line in lines[r])
    assert got == sorted(shown[0].splitlines())


class FakeComm:
    """A communicator of one: any collective through it is a bug."""

    def __init__(self, size=1):
        self.size = size

    def Get_size(self):
        return self.size

    def Allreduce(self, *args, **kwargs):
        raise AssertionError("a collective ran in a world of one")

    Allgather = Allreduce


def test_world_of_one_issues_no_collective_and_normalises_stats():
    r = MPIReducer(FakeComm())
    assert r.world_size() == 1
    assert r.reduce(np.bool_(True)) == (True, None)
    assert r.reduce(0, (np.float32(2.5), 3)) == (False, (2.5, 3.0))
    found, stats = r.reduce(False, {"max_abs": 1, "sumsq": np.float64(4.0), "sum_n": 7})
    assert found is False and stats == {"sumsq": 4.0, "sum_n": 7.0, "max_abs": 1.0}
    assert all(type(v) is float for v in stats.values())


@pytest.mark.parametrize(
    "stats, exc, message",
    [
        (
            {"norm": 1.0},
            ValueError,
            "stats keys must start with 'sum' (added) or 'max' (maxed), got 'norm'",
        ),
        ({1: 1.0}, ValueError, "got 1"),
        ((1.0, 2.0, 3.0), ValueError, "stats as a sequence must be (sumsq, max_abs), got 3 values"),
        ("sumsq", TypeError, "stats must be None, a (sumsq, max_abs) tuple or a dict, got str"),
        ({"sumsq": "1"}, TypeError, "stats['sumsq'] must be a real number"),
        ((1.0, None), TypeError, "stats[1] (max_abs) must be a real number"),
    ],
)
def test_bad_stats_are_rejected(stats, exc, message):
    with pytest.raises(exc) as info:
        MPIReducer(FakeComm()).reduce(False, stats)
    assert message in str(info.value)


def test_any_object_with_reduce_is_a_reducer():
    class Always:
        def reduce(self, found_inf, stats=None):
            return True, stats

    assert check_reducer(None) is None
    r = Always()
    assert check_reducer(r) is r
    assert reduce_found_inf(r, False) is True
    assert reduce_found_inf(None, np.bool_(True)) is True
    with pytest.raises(TypeError, match="reducer must have a method reduce"):
        check_reducer(object())


class Scripted:
    """A reducer standing for the other workers: they report a fault at `bad_steps`."""

    def __init__(self, bad_steps):
        self.bad, self.calls = set(bad_steps), []

    def reduce(self, found_inf, stats=None):
        step = len(self.calls)
        self.calls.append(found_inf)
        return found_inf or step in self.bad, stats


def test_adapter_optimizer_follows_the_reducer(backend):
    """Every adapter's LossScaleOptimizer takes reducer= and skips where it says so."""
    (w,) = backend.variables([np.array([4.0], np.float32)])
    reducer = Scripted(bad_steps={1})
    opt = backend.LossScaleOptimizer(
        backend.sgd([w], 1.0), initial_scale=8.0, dynamic_growth_steps=100, reducer=reducer
    )
    applied = [  # step 1: another worker's fault
        bool(backend.apply(opt, [w], [np.array([g], np.float32)])) for g in (1.0, 1.0, np.nan, 1.0)
    ]
    assert applied == [True, False, False, True]
    assert reducer.calls == [False, False, True, False]
    assert backend.to_numpy(w)[0] == 2.0 and opt.loss_scale == 2.0 and opt.iterations == 4
    with pytest.raises(TypeError, match="reducer must have a method reduce"):
        backend.LossScaleOptimizer(backend.sgd([w], 1.0), reducer=object())


def test_sync_free_cupy_optimizer_refuses_a_reducer(device_backend):
    b = device_backend
    with pytest.raises(ValueError, match="sync_free=True cannot take a reducer"):
        b.LossScaleOptimizer(b.module.SGD(1.0), sync_free=True, reducer=Scripted(()))
