"""Thread safety: exact counters, consistent snapshots, the scan releasing the GIL.

The contract (README "Reliability"): each method call on one lscore object is
atomic with respect to other threads; a sequence of calls is not.  The scan
holds no state of its own and releases the GIL on inputs above 256 KiB.
No test here measures time: they count what happened.
"""

import sys
import threading
import time

import numpy as np
import pytest

import lscore
from lscore import LossScaleState, Policy


@pytest.fixture
def fast_switching():
    """Make the interpreter switch threads as often as it can, so races show."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _run(threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _doubling_policy():
    # every finite step doubles, every non-finite step halves, in float64:
    # the final scale depends only on how many of each, not on their order
    return Policy(
        name="t",
        init_scale=1.0,
        growth_interval=1,
        growth_factor=2.0,
        backoff_factor=0.5,
        precision="float64",
    )


def test_update_from_many_threads_keeps_counters_exact(fast_switching):
    state = LossScaleState(_doubling_policy())
    n_threads, pairs = 8, 2000
    errors = []

    def work():
        try:
            for _ in range(pairs):
                state.update(True)
                state.update(False)
            state.update(True)  # each thread ends one doubling up
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    _run([threading.Thread(target=work) for _ in range(n_threads)])
    assert not errors
    c = state.counters()
    assert c["steps"] == n_threads * (2 * pairs + 1)
    assert c["skipped"] == n_threads * pairs
    assert state.scale == 2.0**n_threads


def test_tf_apis_from_many_threads(fast_switching):
    dyn = lscore.DynamicLossScale(2.0**20, 10**9, 2)  # never grows: scale counts backoffs
    mgr = lscore.ExponentialUpdateLossScaleManager(2.0**20, 10**9, 1, 2, 0.5)
    good, bad = [np.ones(3, np.float32)], [np.array([1.0, np.inf], np.float32)]

    def work():
        for i in range(200):
            dyn.update(bad if i % 100 == 0 else good)
            mgr.update_loss_scale(i % 100 != 0)

    _run([threading.Thread(target=work) for _ in range(5)])
    # 10 overflows in all: each halves the scale, whatever the interleaving
    assert dyn() == 2.0**10 and mgr.get_loss_scale() == 2.0**10
    assert dyn.state.counters()["steps"] == 1000 and dyn.state.counters()["skipped"] == 10
    assert mgr.state.counters()["steps"] == 1000 and mgr.state.counters()["skipped"] == 10


def test_snapshots_are_consistent_while_another_thread_updates(fast_switching):
    # alternate finite / non-finite: after k steps the scale is 2 if k is odd, else 1
    state = LossScaleState(_doubling_policy())
    stop = threading.Event()
    bad = []

    def writer():
        for _ in range(60000):
            state.update(True)
            state.update(False)
        stop.set()

    def reader():
        while not stop.is_set():
            d = state.state_dict()
            k = d["counters"]["steps"]
            if d["scale"] != (2.0 if k % 2 else 1.0) or d["counters"]["skipped"] != k // 2:
                bad.append(d)
            c = state.counters()
            if c["skipped"] != c["steps"] // 2:
                bad.append(c)

    _run([threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)])
    assert not bad, bad[:3]


def test_load_state_dict_races_cleanly_with_update(fast_switching):
    state = LossScaleState(_doubling_policy())
    saved = state.state_dict()
    stop = threading.Event()
    errors = []

    def writer():
        try:
            for _ in range(20000):
                state.update(True)
        except Exception as e:  # pragma: no cover
            errors.append(e)
        stop.set()

    def loader():
        while not stop.is_set():
            state.load_state_dict(saved)

    _run([threading.Thread(target=writer), threading.Thread(target=loader)])
    assert not errors
    # whatever won, the result is a state some sequence of whole calls produced: the
    # saved state and then c["steps"] finite updates (2.0 ** steps while that is finite;
    # a starved loader on a busy machine can leave more than 1023 of them)
    c = state.counters()
    again = LossScaleState.from_state_dict(saved)
    for _ in range(c["steps"]):
        again.update(True)
    assert state.scale == again.scale and c == again.counters() and c["skipped"] == 0
    if c["steps"] <= 1023:
        assert state.scale == 2.0 ** c["steps"] and c["good_steps"] == 0


def _progress_during(call):
    """How often the main thread ran its loop while `call` ran in a worker.

    The switch interval is made huge, so a thread that holds the GIL keeps it
    until it blocks or releases it itself; the main thread gives the GIL up on
    every turn (time.sleep(0)).  If `call` keeps the GIL, the main thread
    cannot run during it and the answer is exactly 0.
    """
    counter = [0]
    done = threading.Event()
    result = {}

    def worker():
        before = counter[0]
        call()
        result["progress"] = counter[0] - before
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        t = threading.Thread(target=worker)
        t.start()
        while not done.is_set():
            counter[0] += 1
            time.sleep(0)
        t.join()
    finally:
        sys.setswitchinterval(old)
    return result["progress"]


def _some_progress(call, tries=6):
    return any(_progress_during(call) > 0 for _ in range(tries))


def test_small_scans_keep_the_gil():
    # the control: proves that _progress_during sees a call that holds the GIL
    small = [np.ones(1000, np.float32)] * 4
    assert all(_progress_during(lambda: lscore.all_finite(small)) == 0 for _ in range(5))


def test_large_all_finite_releases_the_gil():
    big = np.ones(2**24, np.float32)  # 64 MiB
    assert _some_progress(lambda: lscore.all_finite([big, big[::-1]]))


def test_large_unscale_releases_the_gil():
    big = [np.ones(2**22, np.float32) for _ in range(4)]
    assert _some_progress(lambda: lscore.unscale_(big, 0.5))
    assert np.all(big[0] <= 1.0)


def test_raw_scan_releases_the_gil():
    from lscore._ext import _scan

    big = np.ones(2**24, np.float32)
    table = (
        np.array([big.ctypes.data], np.uint64),
        np.array([big.size], np.int64),
        np.array([4], np.int64),
        np.array([3], np.int32),
    )
    assert _some_progress(lambda: _scan.all_finite_raw(*table))


def test_concurrent_scans_agree():
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(50000).astype(np.float32) for _ in range(6)]
    arrays[4][1234] = np.nan
    for a in arrays:
        a.flags.writeable = False
    cases = [(arrays[:4], True), (arrays, False), (arrays[4:5], False), (arrays[5:], True)]
    wrong = []

    def work(i):
        for _ in range(30):
            got, want = cases[i % 4][0], cases[i % 4][1]
            if lscore.all_finite(got) is not want:
                wrong.append(i)

    _run([threading.Thread(target=work, args=(i,)) for i in range(8)])
    assert not wrong
