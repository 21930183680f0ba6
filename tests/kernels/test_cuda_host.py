"""The CUDA kernels run on the CPU (tests/helpers/cuda_host) against the CPU core and
lscore._reference.

The harness compiles the .cu text of _ext/ with g++; lscore.cuda's planner
and launcher run unchanged on top of it.  Small chunks and blocks put many
chunk boundaries into small arrays.
"""

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lscore
from helpers import FLOAT_DTYPES, bits_equal_or_both_nan
from helpers.gen import event_sequence, nonfinite_values, random_policy, special_values
from lscore import LossScaleState, cuda
from lscore import _reference as ref
from lscore.cuda.device_state import DeviceState
from lscore.cuda.launch import MultiTensor, plan_launches
from lscore.cuda.loader import kernel_name
from lscore.dtypes import BY_NAME, Code

if shutil.which("g++") is None:
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host

# (chunk, block, max_tensors, max_blocks): the last ones force many launches
CONFIGS = [
    (8, 1, 4096, 65535),
    (16, 3, 4096, 65535),
    (64, 32, 3, 5),
    (8, 4, 2, 3),
    (1024, 64, 1, 1),
]
INVS = [0.5, 2.0, 1.5, 0.75, 1 / 3, 1.0, 1e-5, 65536.0, 3e-39, 1e30, float(np.float32(1 / 3000))]


@pytest.fixture(scope="module", params=[False, True], ids=["4KB-args", "32KB-args"])
def backend(request):
    b = cuda_host.HostBackend()
    b.large_kernel_params = request.param  # which lsc_meta the launches carry
    return b


@pytest.mark.slow
def test_harness_has_every_kernel_lscore_launches():
    wanted = {n for names in cuda.KERNELS.values() for n in names}
    assert wanted <= set(cuda_host.names())


def test_wrong_argument_width_is_caught(backend):
    from lscore.cuda.plans import meta_dtype

    meta = np.zeros(1, meta_dtype("lsc_meta_4k"))  # the struct passed by value
    flag = np.zeros(1, np.uint32)
    name = kernel_name("all_finite", Code.F32)
    args = (meta[0], np.int32(8), np.uint64(flag.ctypes.data), np.uint32(1))
    with pytest.raises(TypeError, match="argument 1"):
        backend.launch(name, 1, 1, args)
    with pytest.raises(TypeError, match="NumPy scalar"):
        backend.launch(name, 1, 1, (meta[0], 8, flag.ctypes.data, 1))


def _sizes(rng, chunk):
    base = [0, 1, 2, chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk + 5, 7, 31]
    return [int(rng.choice(base)) for _ in range(int(rng.integers(1, 9)))]


def _tensor(rng, dt, n, chunk, offset):
    """A tensor of n elements whose start is `offset` elements into a fresh buffer."""
    base = rng.standard_normal(n + offset) * rng.choice([1e-3, 1.0, 300.0])
    buf = base.astype(dt)
    a = buf[offset:]
    if n and rng.random() < 0.6:
        where = rng.choice(["first", "last", "chunk_edge", "random", "edges"])
        bad = rng.choice(nonfinite_values(dt))
        pos = {
            "first": 0,
            "last": n - 1,
            "chunk_edge": min(n - 1, chunk),
            "random": int(rng.integers(0, n)),
        }
        if where == "edges":
            a[0], a[-1] = bad, -bad if not np.isnan(bad) else bad
        else:
            a[pos[where]] = bad
    if n and rng.random() < 0.3:
        for v in special_values(dt).values():
            a[int(rng.integers(0, n))] = v
    return a


def _cases(seed, count):
    rng = np.random.default_rng(seed)
    for case in range(count):
        chunk, block, mt, mb = CONFIGS[case % len(CONFIGS)]
        dts = [FLOAT_DTYPES[(case // len(CONFIGS)) % len(FLOAT_DTYPES)]]
        if case % 7 == 0:  # mixed dtypes and integer arrays in one call
            dts = [*FLOAT_DTYPES, np.dtype(np.int32)]
        arrays = []
        for n in _sizes(rng, chunk):
            dt = dts[int(rng.integers(0, len(dts)))]
            offset = int(rng.choice([0, 0, 1, 3]))  # misaligned starts take the scalar path
            arrays.append(
                _tensor(rng, dt, n, chunk, offset)
                if dt.kind == "f"
                else rng.integers(-5, 5, n + offset).astype(dt)[offset:]
            )
        yield case, (chunk, block, mt, mb), arrays, float(rng.choice(INVS))


def floats(arrays):
    return [a for a in arrays if a.dtype in FLOAT_DTYPES]


def _table(arrays):
    return (
        [a.ctypes.data for a in arrays],
        [a.size for a in arrays],
        [BY_NAME[a.dtype.name] for a in arrays],
    )


def test_unscale_matches_cpu_core_and_reference(backend):
    for case, cfg, arrays, inv in _cases(3, 400):
        chunk, block, mt, mb = cfg
        runner = MultiTensor(backend, chunk=chunk, block=block, max_tensors=mt, max_blocks=mb)
        cpu = [a.copy() for a in arrays]
        want_ref = [a.copy() for a in arrays]
        # the kernels skip integer arrays; unscale_ refuses them, so it gets the floats
        with np.errstate(over="ignore"):
            finite_ref = ref.unscale_(floats(want_ref), inv)
        finite_cpu = lscore.unscale_(floats(cpu), inv)
        flag = np.zeros(1, np.uint32)
        invbuf = np.array([inv], np.float64)
        runner.run("unscale", *_table(arrays), flag.ctypes.data, invbuf.ctypes.data)
        ctx = f"case {case} config {cfg} inv {inv} " + str(
            [(a.dtype.name, a.size, a.ctypes.data % 16) for a in arrays]
        )
        assert bool(flag[0]) == (not finite_ref) == (not finite_cpu), ctx
        for k, (g, c, r) in enumerate(zip(arrays, cpu, want_ref, strict=True)):
            # bit for bit the CPU core (NaN payloads included, a written float16/bfloat16 NaN
            # as the device's conversion leaves it), and the reference's values
            want = cuda_host.device_words(c, written=inv != 1.0)
            assert np.array_equal(g.view(f"u{g.itemsize}"), want), (ctx, k)
            assert bits_equal_or_both_nan(g, r), (ctx, k)


@pytest.mark.parametrize("large", [False, True], ids=["4KB", "32KB"])
def test_more_arrays_than_one_kernel_argument_holds(large):
    """Past the argument struct's capacity (110 tensors / 320 blocks in 4 KB, 770 / 2240
    in 32 KB) a list is split over launches, each with its own argument: no upload."""
    backend = cuda_host.HostBackend()
    backend.large_kernel_params = large
    nt, nb = (770, 2240) if large else (110, 320)
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(0, 40, nt + 7)]
    arrays += [rng.standard_normal(20).astype(np.float16) for _ in range(3)]
    arrays[-5][-1] = np.inf
    big = np.ones(8 * (nb + 3), np.float32)  # more chunks of 8 than one launch's blocks
    want = [a.copy() for a in [*arrays, big]]
    assert not lscore.unscale_(want, 0.25)
    runner = MultiTensor(backend, chunk=8, block=4)
    assert runner.meta == ("lsc_meta_32k" if large else "lsc_meta_4k")
    flag = np.zeros(1, np.uint32)
    invbuf = np.array([0.25], np.float64)
    n = runner.run("unscale", *_table([*arrays, big]), flag.ctypes.data, invbuf.ctypes.data)
    assert n >= 3 and flag[0] == 1
    for a, w in zip([*arrays, big], want, strict=True):
        assert np.array_equal(a.view(f"u{a.itemsize}"), cuda_host.device_words(w))
    assert {name.split(", ")[1] for name, _, _ in backend.launches} == {runner.meta + ">"}


def test_all_finite_matches_reference(backend):
    for case, cfg, arrays, _ in _cases(5, 400):
        chunk, block, mt, mb = cfg
        runner = MultiTensor(backend, chunk=chunk, block=block, max_tensors=mt, max_blocks=mb)
        before = [a.copy() for a in arrays]
        flag = np.zeros(1, np.uint32)
        runner.run("all_finite", *_table(arrays), flag.ctypes.data)
        assert bool(flag[0]) == (not ref.all_finite(arrays)), (case, cfg)
        for a, b in zip(arrays, before, strict=True):
            assert np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


@pytest.mark.parametrize("code", [Code.F16, Code.BF16])
def test_every_half_bit_pattern(backend, code):
    """All 65,536 words of fp16 and bf16, through the vector path, against the CPU core."""
    dt = np.dtype(np.float16) if code == Code.F16 else np.dtype("bfloat16")
    # 1.5 and 0.75 make many exact ties (round half to even); 2**-20 many subnormals
    for inv in (0.5, 1.5, 0.75, 1 / 3, 2.0**-20, 3.0e4):
        a = np.arange(65536, dtype=np.uint16).view(dt)
        assert a.ctypes.data % 16 == 0
        want = a.copy()
        lscore.unscale_(want, inv)
        flag = np.zeros(1, np.uint32)
        invbuf = np.array([inv], np.float64)
        MultiTensor(backend, chunk=4096, block=64).run(
            "unscale", [a.ctypes.data], [a.size], [code], flag.ctypes.data, invbuf.ctypes.data
        )
        assert flag[0] == 1
        assert np.array_equal(a.view(np.uint16), cuda_host.device_words(want)), inv


def test_found_flag_is_only_set_never_cleared(backend):
    a = np.ones(100, np.float32)
    flag = np.array([1], np.uint32)
    invbuf = np.array([0.5], np.float64)
    MultiTensor(backend, chunk=16, block=4).run(
        "unscale", [a.ctypes.data], [a.size], [Code.F32], flag.ctypes.data, invbuf.ctypes.data
    )
    assert flag[0] == 1 and np.all(a == 0.5)


@pytest.mark.parametrize("seed", range(20))
def test_plan_covers_every_element_once(seed):
    rng = np.random.default_rng(seed)
    chunk = int(rng.choice([8, 16, 64]))
    sizes = [
        int(rng.choice([0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk + 3]))
        for _ in range(int(rng.integers(1, 40)))
    ]
    mt, mb = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    ptrs = [1000 + i for i in range(len(sizes))]
    plan = plan_launches(ptrs, sizes, chunk=chunk, max_tensors=mt, max_blocks=mb)
    count = [np.zeros(n, np.int64) for n in sizes]
    for off, nt, nb in plan.launches:
        assert 1 <= nt <= mt and 1 <= nb <= mb
        t = plan.table[off : off + 2 * nt + nb]
        for b in t[2 * nt :]:
            k, c = int(b) & 0xFFFFFFFF, int(b) >> 32
            assert k < nt
            i = int(t[k]) - 1000
            assert int(t[nt + k]) == sizes[i]
            count[i][c * chunk : (c + 1) * chunk] += 1
    for i, c in enumerate(count):
        assert np.all(c == 1), (sizes[i], c)
    total_blocks = sum(-(-n // chunk) for n in sizes)
    assert sum(nb for _, _, nb in plan.launches) == total_blocks
    # a launch is closed only when full
    for _off, nt, nb in plan.launches[:-1]:
        assert nt == mt or nb == mb


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 70), max_size=30),
    codes=st.lists(st.sampled_from([1, 2, 3, 4]), min_size=30, max_size=30),
    depth=st.integers(1, 5),
    chunk=st.sampled_from([1, 8, 16]),
    limits=st.tuples(st.integers(1, 6), st.integers(1, 9)),
)
def test_packed_arguments_are_the_plan_laid_out_as_the_structs(sizes, codes, depth, chunk, limits):
    """pack_launches writes, per dtype group in first-seen order, the launches of
    plan_launches as the kernels' argument structs (any record depth), then the chunk."""
    from lscore import kernels

    nt_meta, nb_meta = 7, 11
    mt, mb = min(limits[0], nt_meta), min(limits[1], nb_meta)
    codes = codes[: len(sizes)]
    records = np.arange(1, 1 + depth * len(sizes), dtype=np.uint64).reshape(-1, depth) * 1000
    layout = np.dtype(
        [
            ("ptr", "<u8", (depth, nt_meta)),
            ("size", "<i8", (nt_meta,)),
            ("chunk_of", "<i4", (nb_meta,)),
            ("tensor_of", "<u2", (nb_meta,)),
        ]
    )
    args, specs = kernels.pack_launches(
        codes,
        sizes,
        records,
        chunk,
        limits[0],
        limits[1],
        depth,
        nt_meta,
        nb_meta,
        layout.itemsize,
    )
    want_rows, want_specs = [], []
    for code in dict.fromkeys(codes):
        idx = [i for i, c in enumerate(codes) if c == code]
        table, launches = plan_launches(
            idx, [sizes[i] for i in idx], chunk=chunk, max_tensors=mt, max_blocks=mb
        )
        for off, nt, nb in launches:
            row = np.zeros(layout.itemsize + 8, np.uint8)
            m = row[: layout.itemsize].view(layout)[0]
            m["ptr"][:, :nt] = records[table[off : off + nt].astype(np.int64)].T
            m["size"][:nt] = table[off + nt : off + 2 * nt].view(np.int64)
            blocks = table[off + 2 * nt : off + 2 * nt + nb]
            m["chunk_of"][:nb] = blocks >> 32
            m["tensor_of"][:nb] = blocks & 0xFFFFFFFF
            row[layout.itemsize :].view(np.int64)[0] = chunk
            want_rows.append(row)
            want_specs.append((code, nb))
    assert specs == want_specs
    assert args.shape == (len(want_rows), layout.itemsize + 8)
    assert np.array_equal(args, np.array(want_rows).reshape(args.shape))


def test_launch_params_point_at_each_struct_its_chunk_and_the_call_words():
    from lscore import kernels

    args, specs = kernels.pack_launches([1] * 5, [9] * 5, list(range(5)), 8, 2, 3, 1, 2, 3, 56)
    assert len(specs) == 4 and args.shape == (4, 64)
    rows, base = kernels.launch_params(args, 56, 1000, 3)
    assert base == rows.ctypes.data and rows.dtype == np.uint64 and rows.shape == (4, 5)
    starts = args.ctypes.data + 64 * np.arange(4, dtype=np.uint64)
    assert np.array_equal(rows[:, 0], starts) and np.array_equal(rows[:, 1], starts + 56)
    assert np.array_equal(rows[:, 2:], np.tile(np.array([1000, 1008, 1016], np.uint64), (4, 1)))
    # the chunk each row's second pointer names
    assert all(args[k, 56:].view(np.int64)[0] == 8 for k in range(4))
    with pytest.raises(ValueError, match="meta_size"):
        kernels.launch_params(args, 57, 0, 1)
    with pytest.raises(ValueError, match="uint8 matrix"):
        kernels.launch_params(args.view(np.uint16), 8, 0, 1)


def test_packing_refuses_what_the_structs_cannot_hold():
    from lscore import kernels

    ok = ([1], [3], [[5]], 8, 4, 4, 1, 4, 4, 4 * 16 + 4 * 6)
    assert len(kernels.pack_launches(*ok)[1]) == 1
    for k, bad, match in (
        (1, [-1], "negative size"),
        (2, [[5, 6]], "at most 1 addresses"),
        (3, 0, "chunk"),
        (9, 8, "cannot hold"),
        (2, [[5], [6]], "2 records for 1 tensors"),
        (7, 0, "meta_tensors"),
        (8, 0, "meta_blocks"),
        (1, [2**62], "2\\*\\*31 chunks"),
    ):
        args = list(ok)
        args[k] = bad
        with pytest.raises(ValueError, match=match):
            kernels.pack_launches(*args)


def test_plan_rejects_bad_limits():
    with pytest.raises(ValueError, match="chunk"):
        plan_launches([1], [1], chunk=0)


def test_many_tensors_take_several_launches_and_tables_are_cached(backend):
    arrays = [np.full(5, 2.0, np.float32) for _ in range(11)]
    arrays[10][4] = np.inf
    runner = MultiTensor(backend, chunk=8, block=2, max_tensors=4)
    flag = np.zeros(1, np.uint32)
    invbuf = np.array([0.5], np.float64)
    n0 = len(backend.launches)
    assert runner.run("unscale", *_table(arrays), flag.ctypes.data, invbuf.ctypes.data) == 3
    assert flag[0] == 1 and all(np.all(a[:4] == 1.0) for a in arrays)
    assert len(runner._cache) == 1
    runner.run("all_finite", *_table(arrays), flag.ctypes.data)
    assert len(runner._cache) == 1 and len(backend.launches) == n0 + 6


# ---- the device-side update kernel against CyState ------------------------


def _device_for(backend, st: LossScaleState):
    cy = st._cy
    dev = DeviceState(backend, cy.nbytes())
    dev.put(cy.to_bytes())
    return dev


def _inv(policy, scale):
    with np.errstate(divide="ignore", over="ignore"):
        inv = 1.0 / scale if scale != 0 else np.inf
        return inv if policy.precision == "float64" else float(np.float32(inv))


@pytest.mark.parametrize("seed", range(40))
def test_update_kernel_matches_cpu_state(backend, seed):
    rng = np.random.default_rng(1000 + seed)
    for _ in range(8):
        policy = random_policy(rng)
        events = event_sequence(rng, int(rng.integers(1, 40)))
        cpu = LossScaleState(policy)
        dev = _device_for(backend, cpu)
        for i, finite in enumerate(events):
            dev.flags[0] = 0 if finite else 1
            dev.step()
            raw, flags, vals = dev.read()
            r = cpu._cy.update(finite)
            ctx = f"policy {policy} events {events[: i + 1]}"
            assert raw == cpu._cy.to_bytes(), ctx
            assert flags[0] == 0, ctx  # found is consumed
            assert flags[2] == (r == 1), ctx
            assert flags[1] == (r == -1), ctx
            assert vals[1] == cpu.scale or (np.isnan(vals[1]) and np.isnan(cpu.scale)), ctx
            want = _inv(policy, cpu.scale)
            assert vals[0] == want or (np.isnan(vals[0]) and np.isnan(want)), ctx
            if r == -1:
                # frozen until the host reads the flag: a finite step changes nothing
                dev.flags[0] = 0
                dev.step()
                assert dev.read()[0] == raw and dev.read()[1][2] == 0
                dev.clear_floor()
                break


def test_put_refreshes_inverse_and_clears_floor(backend):
    st = LossScaleState(lscore.Policy(init_scale=1024.0))
    dev = _device_for(backend, st)
    dev.flags[1] = 1
    st.set_scale(4.0)
    dev.put(st._cy.to_bytes())
    raw, flags, vals = dev.read()
    assert raw == st._cy.to_bytes() and flags[1] == 0 and list(vals) == [0.25, 4.0]
    with pytest.raises(ValueError, match="bytes"):
        dev.put(b"123")
