"""lscore.distributed.TorchReducer with real torch.distributed processes on 127.0.0.1.

Two gloo ranks (subprocesses, TCP rendezvous on a free port) run every
scenario of tests/helpers/dist/scenarios.py once; the tests below check
their records.  Every launch has a deadline (helpers/dist/launch.py) and
every collective a timeout, so a dead rank fails a test instead of hanging it.
"""

import datetime

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch build has no torch.distributed gloo backend", allow_module_level=True)

from helpers.dist import checks, devices, launch
from lscore.distributed import TorchReducer

WORLD = 2
TEARDOWN_ABORT = "terminate called without an active exception"
CASES = checks.cases(("numpy", "torch", "torch_optimizer"))


def _ok(runs):
    for rank, (rc, out) in enumerate(runs):
        assert rc == 0, f"rank {rank} exited with {rc}:\n{out[-3000:]}"


@pytest.fixture(scope="module")
def gloo_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("gloo")
    _ok(launch.torch_run("scenarios", out, world=WORLD))
    recs = launch.results(out, WORLD)
    assert [r["rank"] for r in recs] == list(range(WORLD))
    assert all(r["size"] == WORLD and r["device"] == "cpu" for r in recs)
    return recs


@pytest.mark.parametrize("check", list(CASES.values()), ids=list(CASES))
def test_scenario(check, gloo_records):
    check(gloo_records)


def test_a_dead_rank_makes_the_others_fail_not_hang(tmp_path):
    runs = launch.torch_run("die", tmp_path, world=WORLD)
    assert runs[-1][0] == 3, runs[-1][1][-2000:]
    _ok(runs[:-1])
    survivor = launch.results(tmp_path, 1)[0]
    assert survivor["error"], "the reduce with a dead peer returned instead of raising"


@pytest.mark.parametrize(
    "gpus, local_rank, want",
    [
        (0, 1, ("gloo", "cpu")),
        (1, 1, ("gloo", "cpu")),  # one GPU, two ranks: rank 1 has none of its own
        (2, 1, ("nccl", "cuda:1")),
        (4, 1, ("nccl", "cuda:1")),
    ],
)
def test_a_rank_gets_a_gpu_of_its_own_or_the_cpu(monkeypatch, gpus, local_rank, want):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    backend, device = devices.pick(local_rank, WORLD)
    assert (backend, str(device)) == want


def test_no_nccl_means_gloo_whatever_the_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert devices.pick(0, WORLD) == ("gloo", torch.device("cpu"))


def test_auto_backend_runs_each_rank_where_pick_says(tmp_path):
    _ok(launch.torch_run("device", tmp_path, world=WORLD, backend="auto"))
    recs = launch.results(tmp_path, WORLD)
    assert [(r["backend"], r["device"]) for r in recs] == [
        (backend, str(device)) for backend, device in (devices.pick(r, WORLD) for r in range(WORLD))
    ]


EXAMPLES = launch.doc_examples("dist.init_process_group")


@pytest.mark.parametrize(
    ("code", "shown", "args"),
    [
        pytest.param(
            code, shown[0] if not args else shown[-1], args, id=name + "-".join(["", *args])
        )
        for code, shown in EXAMPLES
        for name in ["fsdp" if "fully_shard" in code else "ddp"]
        for args in ([], ["--no-group"])
    ],
)
@pytest.mark.slow
def test_documented_example_under_torchrun(code, shown, args, tmp_path):
    """docs/guides/distributed.md's examples print what the page shows, with and without
    process_group (the page's last output block is the run with --no-group)."""
    script = tmp_path / "train.py"
    script.write_text(code)
    runs = launch.torchrun_like(script, tmp_path / "run", world=WORLD, args=args)
    want = sorted(shown.splitlines())
    # torch's own C++ teardown at interpreter exit, after destroy_process_group,
    # has aborted once under heavy load ("terminate called without an active
    # exception", SIGABRT) with every line already printed; only that is let through
    _ok(
        [
            (
                0
                if rc == -6 and TEARDOWN_ABORT in out and out.count("rank ") >= len(want) // WORLD
                else rc,
                out,
            )
            for rc, out in runs
        ]
    )
    lines = launch.rank_lines(*(out for _, out in runs))
    got = sorted(f"rank {r}: {line}" for r in lines for line in lines[r])
    assert got == want


def test_examples_found():
    assert sorted("fully_shard" in code for code, _ in EXAMPLES) == [False, True]
    assert all(shown for _, shown in EXAMPLES)


def _forbid_collectives(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a collective ran in a world of one")

    for name in ("all_reduce", "all_gather_single", "all_gather_into_tensor", "all_gather"):
        if hasattr(dist, name):
            monkeypatch.setattr(dist, name, boom)


def test_no_process_group_is_a_world_of_one(monkeypatch):
    if dist.is_initialized():
        pytest.skip("a default process group is already initialised in this process")
    _forbid_collectives(monkeypatch)
    r = TorchReducer()
    assert r.world_size() == 1
    assert r.reduce(True) == (True, None)
    assert r.reduce(False, {"sumsq": 2, "max_abs": 1.5}) == (False, {"sumsq": 2.0, "max_abs": 1.5})


def test_world_of_one_group_issues_no_collective(monkeypatch):
    if dist.is_initialized():
        pytest.skip("a default process group is already initialised in this process")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{launch.free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        _forbid_collectives(monkeypatch)
        for group in (None, dist.group.WORLD, dist.new_group([0])):
            r = TorchReducer(group)
            assert r.world_size() == 1
            assert r.reduce(True, (4.0, 2.0)) == (True, (4.0, 2.0))
            assert r.device() == torch.device("cpu")
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_nccl_two_gpus(tmp_path):
    if torch.cuda.device_count() < WORLD or not dist.is_nccl_available():
        pytest.skip(f"needs NCCL and {WORLD} CUDA devices")
    _ok(launch.torch_run("scenarios", tmp_path, world=WORLD, backend="nccl"))
    recs = launch.results(tmp_path, WORLD)
    assert [r["device"] for r in recs] == [f"cuda:{r}" for r in range(WORLD)]
    checks.check_reduce_basic(recs)
