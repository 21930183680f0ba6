"""DelayedScaling: TransformerEngine's delayed-scaling state of n tensors, in the compiled core.

Each FP8 cast of a step multiplies by the scale the previous update chose and
max-accumulates its input's amax into the history's current row
(``record``); once per step ``update`` all-reduces that row (one reducer
call; ``DelayedScaling.update_all``: one call for the rows of many states)
and runs TransformerEngine's fused update for every tensor in one compiled
call: the history roll, the amax selection and the scale rule
(NVIDIA/TransformerEngine v2.18,
transformer_engine/common/recipe/delayed_scaling.cu:162-253).  The state is
saved in the JSON-safe format ``lscore.fp8/1``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from lscore import kernels
from lscore.distributed import check_reducer, reduce_max
from lscore.fp8.recipes import FP8_MAX, Recipe, recipe
from lscore.policy import choice, integer, json_float, unjson_number

__all__ = ["FORMAT", "DelayedScaling"]

#: the state format that ``DelayedScaling.state_dict`` writes
FORMAT = "lscore.fp8/1"
_KEYS = ("format", "recipe", "n", "formats", "scale", "scale_inv", "amax_history")
_F32_MAX = float(np.finfo(np.float32).max)


def _amaxes(name: str, values: Any, n: int) -> npt.NDArray[np.float32]:
    """`values` as float32 [n] amaxes: each >= 0, +Inf or NaN; ValueError otherwise."""
    a = np.asarray(values)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise TypeError(f"{name} must be real numbers, got dtype {a.dtype}")
    if a.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {a.shape}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    bad = np.flatnonzero(a < 0)
    if bad.size:
        raise ValueError(f"{name} must be >= 0 (an amax), got {a[bad[0]]!r} at index {int(bad[0])}")
    return a


def _scales(name: str, values: Any, n: int, inf: bool = False) -> npt.NDArray[np.float32]:
    """`values` (a list of n numbers) as float32 scales, each finite (or, with `inf`, +Inf:
    the inverse of a subnormal scale) and > 0."""
    if not isinstance(values, (list, tuple)) or len(values) != n:
        raise ValueError(f"{name} must be a list of {n} numbers, got {values!r}")
    xs = [unjson_number(f"{name}[{i}]", v, wrong_type=ValueError) for i, v in enumerate(values)]
    for i, x in enumerate(xs):
        if not (0 < x <= _F32_MAX or (inf and x == np.inf)) or np.float32(x) == 0:
            rule = "> 0 (finite or +Inf)" if inf else "finite and > 0"
            raise ValueError(f"{name}[{i}] must be {rule} in float32, got {x!r}")
    return np.array(xs, dtype=np.float32)


class DelayedScaling:
    """The delayed-scaling state of `n` tensors under `recipe` (a delayed ``Recipe`` or its name).

    As TransformerEngine keeps it per module and direction: ``scale`` and
    ``scale_inv`` (float32 [n], 1 at first) and ``amax_history`` (float32
    [amax_history_len, n], zeros at first; row 0 is the current step's
    slot, rows 1.. the older amaxes in TransformerEngine's order, the newest
    last).  `formats` is one format name for all tensors or one per tensor
    (default: the recipe's forward_format; under HYBRID a backward state
    takes ``"e5m2"``).

    One step::

        q = quantize(x, state.scale[i])      # with the scale of earlier steps
        state.record(amaxes)                 # each tensor's amax of this step
        state.update(reducer)                # once, after the step

    ``update`` follows TransformerEngine's fused path: a tensor whose
    current amax is 0 (it did not run) neither rolls nor changes; otherwise
    the amax is the maximum of the whole history before the roll (``"max"``;
    NaN entries are skipped, as CUDA's fmaxf does) or the current one
    (``"most_recent"``), the history rolls up by one row, and the scale
    becomes ``fp8_max * 2**-margin / amax`` (FLT_MAX where that overflows),
    kept when the amax is 0, Inf or NaN; ``scale_inv`` is ``1 / scale``.

    The methods take a lock, so threads may share one state.

    >>> import lscore.fp8
    >>> st = lscore.fp8.DelayedScaling("te-delayed", 2)
    >>> st.record([3.0, 0.0])
    >>> st.update()
    >>> st.scale, st.amax_history[-1]
    (array([149.33333,   1.     ], dtype=float32), array([3., 0.], dtype=float32))
    """

    def __init__(
        self, recipe: Recipe | str, n: int, formats: str | Sequence[str] | None = None
    ) -> None:
        r = _recipe(recipe)
        if r.scaling != "delayed":
            raise ValueError(
                f"recipe must be a delayed-scaling recipe, got {r.name!r} with "
                f"scaling={r.scaling!r}"
            )
        n = integer("n", n, minimum=1)
        if formats is None:
            formats = r.forward_format
        if isinstance(formats, str):
            formats = [formats] * n
        formats = [choice("formats[i]", f, tuple(FP8_MAX)) for f in formats]
        if len(formats) != n:
            raise ValueError(f"formats must name {n} formats, got {len(formats)}")
        scaled = np.array(
            [kernels.fp8_scaled_max(FP8_MAX[f], r.margin) for f in formats], np.float32
        )
        self._recipe = r
        self._formats = tuple(formats)
        self._cy = kernels.Fp8Delayed(
            n, r.amax_history_len, r.amax_compute_algo, r.amax_nan == "propagate", scaled
        )
        self._lock = threading.Lock()

    @property
    def recipe(self) -> Recipe:
        return self._recipe

    @property
    def n(self) -> int:
        """The number of tensors."""
        return len(self._formats)

    @property
    def formats(self) -> tuple[str, ...]:
        """Each tensor's float8 format."""
        return self._formats

    @property
    def scale(self) -> npt.NDArray[np.float32]:
        """The scales the next casts multiply by (a copy, float32 [n])."""
        return self._cy.scale

    @property
    def scale_inv(self) -> npt.NDArray[np.float32]:
        """``1 / scale`` (a copy, float32 [n]): what a cast's dequantization multiplies by."""
        return self._cy.scale_inv

    @property
    def amax_history(self) -> npt.NDArray[np.float32]:
        """The history (a copy, float32 [amax_history_len, n]), TransformerEngine's row order."""
        return self._cy.history

    def record(self, amaxes: Any) -> None:
        """Max-accumulate this cast's amaxes (n values, >= 0, Inf or NaN) into the current row.

        Several casts between two updates (micro-batches) keep the maximum.
        A NaN amax is skipped under the recipe's ``amax_nan="ignore"`` and
        makes the slot NaN under ``"propagate"``.
        """
        a = _amaxes("amaxes", amaxes, self.n)
        with self._lock:
            self._cy.record(a)

    def update(self, reducer: Any = None) -> None:
        """Agree on the current amaxes with one reducer call (elementwise MAX, see
        ``lscore.distributed.reduce_max``), then update every tensor (see the class)."""
        DelayedScaling.update_all((self,), reducer)

    @staticmethod
    def update_all(states: Sequence[DelayedScaling], reducer: Any = None) -> None:
        """``update(reducer)`` of every state in `states` with one reducer call for all.

        The current amax rows of all the states travel as one row (as TransformerEngine
        all-reduces every amax of a step in one collective), then each state runs its
        compiled update; the result is bitwise that of updating each state with its own
        reducer call.  No state is changed when the reducer fails.  Every worker passes its
        states in the same order; with no states nothing is reduced.
        """
        states = tuple(states)
        for i, s in enumerate(states):
            if not isinstance(s, DelayedScaling):
                raise TypeError(f"states[{i}] must be a DelayedScaling, got {type(s).__name__}")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("states must hold each state once, got one state twice")
        check_reducer(reducer)
        with contextlib.ExitStack() as held:
            # one lock order for every caller (by address), so that two threads updating
            # overlapping lists cannot each hold a lock the other waits for
            for s in sorted(states, key=id):
                held.enter_context(s._lock)
            if reducer is not None and states:
                rows = np.concatenate([s._cy.current for s in states])
                reduced = _amaxes("the reduced amaxes", reduce_max(reducer, rows), rows.size)
                start = 0
                for s in states:
                    s._cy.set_current(reduced[start : start + s.n])
                    start += s.n
            for s in states:
                s._cy.update()

    def state_dict(self) -> dict[str, Any]:
        """The ``lscore.fp8/1`` state: JSON-safe and exact (float32 values as JSON numbers,
        non-finite ones as "inf" / "nan")."""
        with self._lock:
            h, s, si = self._cy.history, self._cy.scale, self._cy.scale_inv
        return {
            "format": FORMAT,
            "recipe": self._recipe.to_dict(),
            "n": self.n,
            "formats": list(self._formats),
            "scale": [json_float(float(x)) for x in s],
            "scale_inv": [json_float(float(x)) for x in si],
            "amax_history": [[json_float(float(x)) for x in row] for row in h],
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Take a state this recipe, n and formats saved; every value is checked before
        anything is written (scales finite and > 0, their inverses > 0, amaxes >= 0, Inf or
        NaN)."""
        if not isinstance(d, dict):
            raise TypeError(f"a state dict must be a dict, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise ValueError(f"the state's format must be {FORMAT!r}, got {d.get('format')!r}")
        missing = [k for k in _KEYS if k not in d]
        if missing:
            raise ValueError(f"the state lacks {', '.join(missing)}")
        theirs = Recipe.from_dict(d["recipe"])
        if theirs != self._recipe:
            mine, other = self._recipe.to_dict(), theirs.to_dict()
            diff = [k for k in mine if mine[k] != other[k]]
            raise ValueError(
                "the state was saved by a different recipe ("
                + ", ".join(f"{k}: {other[k]!r} != {mine[k]!r}" for k in diff)
                + ")"
            )
        if d["n"] != self.n or list(d["formats"]) != list(self._formats):
            raise ValueError(
                f"the state is of {d['n']!r} tensors with formats {d['formats']!r}, "
                f"this one of {self.n} with {list(self._formats)!r}"
            )
        scale = _scales("scale", d["scale"], self.n)
        scale_inv = _scales("scale_inv", d["scale_inv"], self.n, inf=True)
        rows = d["amax_history"]
        length = self._recipe.amax_history_len
        if not isinstance(rows, (list, tuple)) or len(rows) != length:
            raise ValueError(f"amax_history must be a list of {length} rows")
        history = np.empty((length, self.n), np.float32)
        for i, row in enumerate(rows):
            if not isinstance(row, (list, tuple)):
                raise ValueError(f"amax_history[{i}] must be a list of {self.n} numbers")
            values = [unjson_number(f"amax_history[{i}]", v, wrong_type=ValueError) for v in row]
            history[i] = _amaxes(f"amax_history[{i}]", np.array(values), self.n)
        with self._lock:
            self._cy.load(history, scale, scale_inv)

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> DelayedScaling:
        """The state a ``state_dict`` describes, recipe, n and formats included."""
        if not isinstance(d, dict) or not all(k in d for k in ("recipe", "n", "formats")):
            raise ValueError("a state dict must hold the recipe, n and formats it was saved with")
        obj = cls(Recipe.from_dict(d["recipe"]), d["n"], d["formats"])
        obj.load_state_dict(d)
        return obj

    def __repr__(self) -> str:
        return (
            f"DelayedScaling(recipe={self._recipe.name!r}, n={self.n}, "
            f"scale={self.scale.tolist()!r})"
        )


def _recipe(r: Any) -> Recipe:
    if isinstance(r, Recipe):
        return r
    if isinstance(r, str):
        r = recipe(r)
        if isinstance(r, Recipe):
            return r
        raise ValueError(f"recipe must be a per-tensor recipe, got the block recipe {r.name!r}")
    raise TypeError(f"recipe must be a Recipe or a recipe name, got {type(r).__name__}")
