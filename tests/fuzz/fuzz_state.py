"""atheris fuzz target: the compiled state machine against lscore._reference.update.

Random bytes become a policy (any combination of the core's parameters,
arbitrary floats included; invalid ones must be refused with ValueError or
TypeError and nothing else) and a sequence of finite/non-finite events.  At
every step the return code, the scale (bitwise, NaN aside) and every counter
must equal the reference's; a v1 state dict taken mid-run must round-trip
through JSON and continue identically.  See tests/fuzz/README.md.
"""

import json
import math
import sys

import atheris

with atheris.instrument_imports():
    from lscore import LossScaleFloorError, LossScaleState, Policy
    from lscore import _reference as ref
    from lscore import policy as _params

SPECIAL = [
    0.0,
    1.0,
    0.5,
    2.0,
    1.1,
    1e-30,
    2.0**-126,
    2.0**-149,
    65536.0,
    3.4028234663852886e38,
    1e308,
    float("inf"),
    float("nan"),
    -1.0,
]


def number(fdp):
    return fdp.PickValueInList(SPECIAL) if fdp.ConsumeBool() else fdp.ConsumeFloat()


def maybe(fdp, make):
    return None if fdp.ConsumeBool() else make()


def policy(fdp) -> Policy:
    return Policy(
        name="fuzz",
        init_scale=number(fdp),
        growth_factor=number(fdp),
        backoff_factor=number(fdp),
        growth_interval=fdp.ConsumeIntInRange(-3, 40),
        hysteresis=fdp.ConsumeIntInRange(0, 5),
        min_scale=maybe(fdp, lambda: number(fdp)),
        max_scale=maybe(fdp, lambda: number(fdp)),
        precision=fdp.PickValueInList(list(_params.PRECISIONS)),
        growth_mode=fdp.PickValueInList(list(_params.GROWTH_MODES)),
        growth_offset=fdp.ConsumeIntInRange(-1, 5),
        backoff_mode=fdp.PickValueInList(list(_params.BACKOFF_MODES)),
        min_action=fdp.PickValueInList(list(_params.MIN_ACTIONS)),
        guard_finite=fdp.ConsumeBool(),
        refill=tuple(r for r in _params.REFILLS if fdp.ConsumeBool()),
        hysteresis_saturate=fdp.ConsumeBool(),
        apply_nonfinite=fdp.ConsumeBool(),
        flush_subnormal=fdp.ConsumeBool(),
        apply_next=fdp.ConsumeBool(),
        tolerance=fdp.PickValueInList([0.0, 0.25, 0.5, 1.0, -1.0, float("nan")]),
        floor_scale=maybe(fdp, lambda: number(fdp)),
        growth_factor_after_overflow=maybe(fdp, lambda: number(fdp)),
    )


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (
        a == b and math.copysign(1, a) == math.copysign(1, b)
    )


def step(st: LossScaleState, finite: bool) -> int:
    try:
        return 1 if st.update(finite) else 0
    except LossScaleFloorError:
        return -1


def TestOneInput(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    try:
        p = policy(fdp)
    except (ValueError, TypeError):
        return
    st = LossScaleState(p)
    r = ref.RefState.initial(p)
    events = [fdp.ConsumeBool() for _ in range(fdp.ConsumeIntInRange(0, 200))]
    cut = fdp.ConsumeIntInRange(0, len(events))
    for i, finite in enumerate(events):
        if i == cut:  # resume from a JSON checkpoint, as a new process would
            st = LossScaleState.from_state_dict(
                json.loads(json.dumps(st.state_dict(), allow_nan=False))
            )
        r, code = ref.update(r, finite)
        got = step(st, finite)
        c = st.counters()
        want = {k: getattr(r, k) for k in c}
        if got != code or not same(st.scale, r.scale) or c != want:
            raise AssertionError(
                f"step {i}: got ({got}, {st.scale}, {c}), reference "
                f"({code}, {r.scale}, {want}); events {events[: i + 1]}; {p}"
            )


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
