"""`lscore bench --suite fp8`: per-tensor float8 quantize against torch and the byte floor.

Each group is one quantize of one array to float8_e4m3fn: "delayed" is the
one pass with a given scale that also returns the input's amax
(``lscore.fp8.quantize``), "current" the two passes of current scaling
(``lscore.fp8.amax``, torchao's ``amax_to_scale`` rule on the scalar, then
the cast).  The lscore rows write into a buffer allocated once, as a
training step reuses its own.  The baselines are the same recipe written in
torch ops as torchao writes it (torchao/float8 v0.18.0:
``torch.max(|x|)``, ``finfo.max / clamp(amax.double(), min=1e-12)``,
``(x.float() * scale).clamp(-max, max).to(float8_e4m3fn)``), eagerly and
under ``torch.compile`` (skipped with the reason where it fails), and the
byte floor: the bytes the quantize must move (delayed: one read of the
input and one byte written per element; current: two reads and one byte)
at the copy bandwidth of a C memcpy of the input timed in the same run.
GPU rows need a CUDA device and torch built for it (skipped otherwise).
"""

from __future__ import annotations

import numpy as np

from lscore import kernels
from lscore.bench._harness import Rows, as_tensor, dtype_of, import_torch, size_label
from lscore.bench._report import find

SIZES = (10**5, 10**6, 10**7, 10**8)
TINY_SIZES = (10**3, 4096)
DTYPES = ("bfloat16", "float32")
RECIPES = ("delayed", "current")
METHODS = ("lscore", "torch eager", "torch.compile", "C memcpy", "byte floor")
FMT = "float8_e4m3fn"
E4M3_MAX = 448.0
EPS = 1e-12  # torchao/float8/float8_utils.py: EPS
SCALE = 2.0  # the delayed rows' given scale


def _scale_from_amax(a: float) -> np.float32:
    """torchao's amax_to_scale for e4m3fn: float64 division, clamped amax, float32 result."""
    return np.float32(E4M3_MAX / max(float(a), EPS))


def lscore_fns(x: np.ndarray):
    """(delayed, current) quantize of x with lscore's public functions, into one buffer."""
    import lscore.fp8 as Q

    q = np.empty(x.shape, np.uint8)

    def delayed():
        return Q.quantize(x, SCALE, "e4m3fn", amax_nan="propagate", out=q)

    def current():
        s = _scale_from_amax(Q.amax(x, nan="propagate"))
        return Q.quantize(x, s, "e4m3fn", amax_nan="propagate", out=q)

    return delayed, current


def torch_fns(torch):
    """(delayed, current) in torch ops, torchao's recipe."""
    f8 = torch.float8_e4m3fn

    def delayed(x, scale):
        amax = torch.max(torch.abs(x))
        q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(f8)
        return q, amax

    def current(x):
        amax = torch.max(torch.abs(x))
        scale = (E4M3_MAX / torch.clamp(amax.double(), min=EPS)).float()
        q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(f8)
        return q, scale

    return delayed, current


def _compiled(torch, fn, args):
    """torch.compile(fn) warmed on args, or (None, why) when it does not compile or run."""
    try:
        c = torch.compile(fn, dynamic=False)
        c(*args)
        return c, None
    except Exception as e:
        return None, f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"


def why_no_cuda(torch) -> str | None:
    """Why the GPU rows are skipped, or None when a CUDA device is there."""
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def _sizes(opts) -> tuple:
    if opts.tiny:
        return TINY_SIZES
    return tuple(opts.sizes) if opts.sizes_given else SIZES


def add_floor(
    rows: Rows,
    group: str,
    copy_row: dict | None,
    reads: int,
    width: int,
    n: int,
    written: float = 1.0,
):
    """The byte floor of a group: its bytes (`reads` reads of the input, `written` bytes per
    element written) at the memcpy's bandwidth (derived, not timed)."""
    if copy_row is None or "median_s" not in copy_row:
        rows.append({"group": group, "method": "byte floor", "skipped": "no memcpy timing"})
        return
    moved = round((reads * width + written) * n)
    f = moved / (2 * width * n)  # the memcpy moved 2 * width bytes per element
    rows.append(
        {
            "group": group,
            "method": "byte floor",
            "bytes": moved,
            "per": 1,
            "note": f"{reads} read(s) + {written:.4g} byte/element at the memcpy's GB/s",
            **{k: copy_row[k] * f for k in ("median_s", "min_s", "max_s")},
            "gbps": copy_row["gbps"],
        }
    )


def run_cpu(opts, rows: Rows, rng) -> None:
    """The CPU rows: every size, dtype and recipe."""
    torch = import_torch() if opts.use_torch else None
    for n in _sizes(opts):
        for name in DTYPES:
            dt = dtype_of(name)
            if dt is None:
                for recipe in RECIPES:
                    rows.add(f"fp8 {recipe} {name} {size_label(n)}", "lscore", skip="no ml_dtypes")
                continue
            groups = {r: f"fp8 {r} {name} {size_label(n)}" for r in RECIPES}
            g_copy = f"fp8 memcpy {name} {size_label(n)}"
            if not rows.wanted(*groups.values(), g_copy, opts=opts):
                continue
            x = rng.standard_normal(n, dtype=np.float32).astype(dt)
            width = x.itemsize
            l_delayed, l_current = lscore_fns(x)
            dst = np.empty_like(x)
            kw = dict(dtype=name, n=n, opts=opts)
            rows.add(groups["delayed"], "lscore", l_delayed, nbytes=(width + 1) * n, **kw)
            rows.add(groups["current"], "lscore", l_current, nbytes=(2 * width + 1) * n, **kw)
            if torch is None:
                for g in groups.values():
                    rows.add(g, "torch eager", skip="torch is not installed", **kw)
            else:
                t = as_tensor(torch, x)
                s = torch.tensor(SCALE)
                t_delayed, t_current = torch_fns(torch)
                rows.add(
                    groups["delayed"], "torch eager", lambda f=t_delayed, t=t, s=s: f(t, s), **kw
                )
                rows.add(groups["current"], "torch eager", lambda f=t_current, t=t: f(t), **kw)
                for recipe, fn, args in (
                    ("delayed", t_delayed, (t, s)),
                    ("current", t_current, (t,)),
                ):
                    c, why = _compiled(torch, fn, args)
                    rows.add(
                        groups[recipe],
                        "torch.compile",
                        (lambda c=c, args=args: c(*args)) if c is not None else None,
                        skip=why,
                        **kw,
                    )
            rows.add(
                g_copy,
                "C memcpy",
                lambda dst=dst, x=x: kernels.copy_bandwidth(dst, x),
                nbytes=2 * width * n,
                **kw,
            )
            rows.flush()
            copy_row = find(rows.rows, g_copy, "C memcpy")
            add_floor(rows, groups["delayed"], copy_row, 1, width, n)
            add_floor(rows, groups["current"], copy_row, 2, width, n)
            del x, dst


def run_gpu(opts, rows: Rows, rng) -> None:
    """The GPU rows (torch CUDA tensors: lscore's adapter against torch), or one skipped row."""
    torch = import_torch() if opts.use_torch else None
    why = why_no_cuda(torch)
    if torch is None or why is not None:
        rows.add("fp8 gpu", "lscore", skip=why or "torch is not installed")
        return
    from lscore.adapters.torch import quantize as TQ

    t_delayed, t_current = torch_fns(torch)
    for n in _sizes(opts):
        for name in DTYPES:
            groups = {r: f"fp8 gpu {r} {name} {size_label(n)}" for r in RECIPES}
            g_copy = f"fp8 gpu memcpy {name} {size_label(n)}"
            if not rows.wanted(*groups.values(), g_copy, opts=opts):
                continue
            dt = getattr(torch, name)
            x = torch.randn(n, device="cuda").to(dt)
            s = torch.tensor(SCALE, device="cuda")
            q = torch.empty(n, dtype=torch.uint8, device="cuda")
            kw = dict(dtype=name, n=n, opts=opts)

            def l_delayed(x=x, q=q):
                TQ.quantize(x, SCALE, "e4m3fn", amax_nan="propagate", out=q)
                torch.cuda.synchronize()

            def l_current(x=x, q=q):
                a = TQ.amax(x, nan="propagate")
                sc = (E4M3_MAX / torch.clamp(a.double(), min=EPS)).float()
                TQ.quantize(x, sc, "e4m3fn", amax_nan="propagate", out=q)
                torch.cuda.synchronize()

            def synced(fn, *args):
                def call():
                    fn(*args)
                    torch.cuda.synchronize()

                return call

            rows.add(groups["delayed"], "lscore", l_delayed, **kw)
            rows.add(groups["current"], "lscore", l_current, **kw)
            rows.add(groups["delayed"], "torch eager", synced(t_delayed, x, s), **kw)
            rows.add(groups["current"], "torch eager", synced(t_current, x), **kw)
            for recipe, fn, args in (("delayed", t_delayed, (x, s)), ("current", t_current, (x,))):
                c, why = _compiled(torch, fn, args)
                rows.add(
                    groups[recipe],
                    "torch.compile",
                    synced(c, *args) if c is not None else None,
                    skip=why,
                    **kw,
                )
            dst = torch.empty_like(x)
            rows.add(
                g_copy, "C memcpy", synced(dst.copy_, x), nbytes=2 * x.element_size() * n, **kw
            )
            rows.flush()
            copy_row = find(rows.rows, g_copy, "C memcpy")
            add_floor(rows, groups["delayed"], copy_row, 1, x.element_size(), n)
            add_floor(rows, groups["current"], copy_row, 2, x.element_size(), n)
            del x, dst, q


def add_floors(rows: Rows, groups: dict, g_copy: str, width: int, n: int, traffic: dict) -> None:
    """Time the queued rows, then give each recipe's group (`groups`: recipe -> group) its
    byte floor from the copy timed in `g_copy`; `traffic`: recipe -> (input reads, bytes
    written per element)."""
    rows.flush()
    copy_row = find(rows.rows, g_copy, "C memcpy")
    for r, g in groups.items():
        reads, written = traffic[r]
        add_floor(rows, g, copy_row, reads, width, n, written)


def block_cases(opts, rows: Rows, rng, sizes, dtypes, recipes, label: str, block: int, shape):
    """(n, groups: recipe -> group, the memcpy's group, input, row keywords) of
    each size and dtype whose rows are wanted and whose input is whole blocks of `block`
    (else a skipped row in each group): a block-scaled suite's CPU cases."""
    for n in sizes:
        for name in dtypes:
            groups = {r: f"fp8 {r} {name} {size_label(n)}" for r in recipes}
            g_copy = f"fp8 {label} memcpy {name} {size_label(n)}"
            if not rows.wanted(*groups.values(), g_copy, opts=opts):
                continue
            x = block_input(rows, groups, n, name, block, shape, rng, opts)
            if x is not None:
                yield n, groups, g_copy, x, dict(dtype=name, n=n, opts=opts)


def block_cpu_rows(opts, rows: Rows, cases, lscore_fns, torch_fns, traffic: dict) -> None:
    """The rows of each CPU case of ``block_cases``: per recipe "lscore", "lscore out="
    (`lscore_fns(x)` / `lscore_fns(x, reuse=True)`, recipe -> call) and "torch eager"
    (`torch_fns(torch)`, recipe -> function of a tensor), then the input's memcpy and the
    byte floors by `traffic` (recipe -> (input reads, bytes written per element))."""
    torch = import_torch() if opts.use_torch else None
    t_fns = torch_fns(torch) if torch is not None else None
    for n, groups, g_copy, x, kw in cases:
        width = x.itemsize
        fns, into = lscore_fns(x), lscore_fns(x, reuse=True)
        for r, g in groups.items():
            reads, written = traffic[r]
            nbytes = round((reads * width + written) * n)
            rows.add(g, "lscore", fns[r], nbytes=nbytes, **kw)
            rows.add(g, "lscore out=", into[r], nbytes=nbytes, **kw)
            if t_fns is None:
                rows.add(g, "torch eager", skip="torch is not installed", **kw)
            else:
                t = as_tensor(torch, x)
                rows.add(g, "torch eager", lambda f=t_fns[r], t=t: f(t), **kw)
        dst = np.empty_like(x)
        copy = lambda dst=dst, x=x: kernels.copy_bandwidth(dst, x)  # noqa: E731
        rows.add(g_copy, "C memcpy", copy, nbytes=2 * width * n, **kw)
        add_floors(rows, groups, g_copy, width, n, traffic)
        del x, dst


def gpu_block_cases(opts, rows: Rows, torch, device, sizes, dtypes, recipes, label, block, shape):
    """The GPU counterpart of ``block_cases``: (n, groups, the copy's group, a standard-normal
    tensor of `shape(n)` on `device`, row keywords) for each size that is whole blocks."""
    for n in sizes:
        if n % block:
            continue
        for name in dtypes:
            groups = {r: f"fp8 gpu {r} {name} {size_label(n)}" for r in recipes}
            g_copy = f"fp8 gpu {label} memcpy {name} {size_label(n)}"
            if not rows.wanted(*groups.values(), g_copy, opts=opts):
                continue
            x = torch.randn(shape(n), device=device).to(getattr(torch, name))
            yield n, groups, g_copy, x, dict(dtype=name, n=n, opts=opts)


def synced(torch, device: str):
    """fn(*args, **kw) bound into a call that synchronizes `device` after it (CUDA only)."""

    def bind(fn, *args, **kw):
        def call():
            fn(*args, **kw)
            if device == "cuda":
                torch.cuda.synchronize()

        return call

    return bind


def block_input(rows: Rows, groups: dict, n: int, name: str, block: int, shape, rng, opts):
    """A standard-normal 2-D input of n elements of dtype `name` shaped `shape(n)`, or None
    after a skipped row in each group (no ml_dtypes, or n not a whole number of blocks)."""
    dt = dtype_of(name)
    why = "no ml_dtypes" if dt is None else None
    if n % block:
        why = f"{n} elements are not a whole number of blocks of {block}"
    if why is not None:
        for g in groups.values():
            rows.add(g, "lscore", skip=why, dtype=name, n=n, opts=opts)
        return None
    return rng.standard_normal(n, dtype=np.float32).astype(dt).reshape(shape(n))


def ratio_target(
    rows: list[dict],
    name: str,
    group: str,
    base: str,
    need: float,
    lower: bool,
    method: str = "lscore",
):
    """One ratio target of a group's `method` row: its time over the `base` row's (`lower`:
    at most `need`), or the base's over its own (at least `need`); best times."""
    r, b = find(rows, group, method), find(rows, group, base)
    if r is None or b is None:
        return {"target": name, "measured": None, "required": need, "met": None}
    m = r["min_s"] / b["min_s"] if lower else b["min_s"] / r["min_s"]
    met = m <= need if lower else m >= need
    return {"target": name, "measured": m, "required": need, "met": met, "unit": "ratio"}


def timed(rows: list[dict], group: str, method: str) -> bool:
    """Whether the run timed `method` in `group` (not absent, not skipped)."""
    r = find(rows, group, method)
    return r is not None and "min_s" in r


def targets(rows: list[dict], opts) -> list[dict]:
    """Issue 34's speed targets: on the CPU rows, quantize >= 20x torch eager and >= 1.5x
    torch.compile at 1e6-1e8, and the one-pass cast within 1.5x of the byte floor at 1e8;
    on the GPU rows (where a device timed them), quantize within 1.3x of the byte floor at
    1e8 and >= 3x torch.compile at 1e7.  Issue 47's: on the CPU rows at 1e6 (mid-size
    tensors, where a call's fixed cost and the loop's instructions show), both recipes
    within 2x of the byte floor."""
    out = []

    def add(name, group, base, need, lower):
        out.append(ratio_target(rows, name, group, base, need, lower))

    for n in _sizes(opts):
        for name in DTYPES:
            for recipe in RECIPES:
                g = f"fp8 gpu {recipe} {name} {size_label(n)}"
                if not timed(rows, g, "lscore"):
                    continue
                if n == 10**8:
                    add(f"{g}: lscore / byte floor", g, "byte floor", 1.3, True)
                if n == 10**7:
                    add(f"{g}: torch.compile / lscore", g, "torch.compile", 3.0, False)

    for n in _sizes(opts):
        if n < 10**6:
            continue
        for name in DTYPES:
            for recipe in RECIPES:
                g = f"fp8 {recipe} {name} {size_label(n)}"
                add(f"{g}: torch eager / lscore", g, "torch eager", 20.0, False)
                add(f"{g}: torch.compile / lscore", g, "torch.compile", 1.5, False)
            if n >= 10**8:
                g = f"fp8 delayed {name} {size_label(n)}"
                add(f"{g}: lscore / byte floor", g, "byte floor", 1.5, True)
            if n == 10**6:
                for recipe in RECIPES:
                    g = f"fp8 {recipe} {name} {size_label(n)}"
                    add(f"{g}: lscore / byte floor", g, "byte floor", 2.0, True)
    return out
