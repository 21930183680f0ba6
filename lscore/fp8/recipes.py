"""FP8 scaling recipes as exact parameter sets: ``lscore.fp8.recipe(name, **overrides)``.

A ``Recipe`` names every choice a per-tensor (or per-row) FP8 scaling makes:
delayed or current scaling, the formats, TransformerEngine's history and
margin, the scale rule and its power-of-two rounding, and how NaN and
overflow are treated.  The presets are rows of ``TABLE``, each citing the
source lines of the library it follows: NVIDIA/TransformerEngine at tag
v2.18 ("TE") and pytorch/ao at tag v0.18.0 ("ao"), which its ``source`` names.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from lscore import kernels
from lscore.fp8 import block_recipes as blocks
from lscore.fp8 import revisions
from lscore.fp8.checks import exact_fields, preset_fields
from lscore.policy import boolean, choice, integer, real

__all__ = ["FP8_MAX", "RECIPES", "TABLE", "Recipe", "recipe"]

#: the largest finite value of each float8 format (its finfo.max)
FP8_MAX = {"e4m3fn": 448.0, "e5m2": 57344.0}

# TE's fp8_format names -> (forward, backward) formats
# (TE:transformer_engine/common/recipe/__init__.py:29-50); MXFP8BlockScaling takes E4M3
# (its default) and HYBRID (TE:transformer_engine/common/recipe/__init__.py:366-373)

# What the current-scaling presets of each library share (margin, history and amax
# selection are delayed scaling's, unused by current scaling).  TE: casts saturate both
# formats with NaN 0x7F (CUDA's __NV_SATFINITE types, TE:transformer_engine/common/
# common.h:645) and the amax skips NaN elements (fmaxf: TE:transformer_engine/common/
# util/vectorized_pointwise.h:184-219).  torchao: amax torch.max(|x|) (NaN propagates),
# scale amax_to_scale with EPS 1e-12 (ao:torchao/float8/float8_utils.py:18-53), cast
# to_fp8_saturated (ao:torchao/float8/float8_utils.py:118-139; torch keeps a NaN's sign).
_CURRENT = dict(
    scaling="current",
    granularity="tensor",
    margin=0,
    amax_history_len=1,
    amax_compute_algo="most_recent",
    power_2_scales=False,
    saturate=True,
)
_TE = dict(
    _CURRENT, rule="te", amax_epsilon=0.0, amax_nan="ignore", nan_sign=False, source=revisions.TE
)
_TORCHAO = dict(
    _CURRENT,
    rule="torchao",
    amax_epsilon=1e-12,
    amax_nan="propagate",
    nan_sign=True,
    source=revisions.AO,
)

#: every preset: name -> the Recipe fields it fixes (the comment above each cites its source)
TABLE: dict[str, dict[str, Any]] = {
    # TE v2.18 DelayedScaling defaults: margin 0, fp8_format HYBRID, amax_history_len 1024,
    # amax_compute_algo "max" (TE:transformer_engine/common/recipe/__init__.py:172-282);
    # the update is the fused bulk kernel (TE:transformer_engine/common/recipe/
    # delayed_scaling.cu:162-253)
    "te-delayed": dict(
        _TE,
        scaling="delayed",
        forward_format="e4m3fn",
        backward_format="e5m2",
        amax_history_len=1024,
        amax_compute_algo="max",
    ),
    # TE v2.18 Float8CurrentScaling: HYBRID, use_power_2_scales False, amax_epsilon 0
    # (TE:transformer_engine/common/recipe/__init__.py:285-333); the scale is
    # compute_scale_from_amax (TE:transformer_engine/common/recipe/recipe_common.cuh:14-49)
    # of an fmaxf amax (TE:transformer_engine/common/recipe/current_scaling.cu:24-70)
    "te-current": dict(_TE, forward_format="e4m3fn", backward_format="e5m2"),
    # torchao v0.18.0's "tensorwise" recipe: dynamic, e4m3fn input and weight, e5m2 grad_output
    # (ao:torchao/float8/config.py:297-309, 331-333)
    "torchao-tensorwise": dict(_TORCHAO, forward_format="e4m3fn", backward_format="e5m2"),
    # torchao v0.18.0's "rowwise" recipe: AXISWISE, e4m3fn for input, weight and grad_output,
    # round_scales_to_power_of_2=True (ao:torchao/float8/config.py:334-352)
    "torchao-rowwise": dict(
        _TORCHAO,
        granularity="row",
        forward_format="e4m3fn",
        backward_format="e4m3fn",
        power_2_scales=True,
    ),
}

#: the preset names, in TABLE's order
RECIPES = tuple(TABLE)

_FORMATS = tuple(FP8_MAX)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One FP8 scaling recipe: every parameter, validated when the object is made.

    Attributes
    ----------
    name : str
        The preset it came from, or any name of a custom recipe.
    scaling : "delayed" | "current"
        Delayed: a tensor is cast with the scale of earlier steps' amaxes
        (``lscore.fp8.DelayedScaling``, TransformerEngine only); current:
        from its own amax, in two passes.
    granularity : "tensor" | "row"
        One scale per tensor, or one per row (torchao's axiswise).
    forward_format, backward_format : "e4m3fn" | "e5m2"
        Formats of the forward tensors (inputs, weights) and of the gradients.
    margin : int
        TE's delayed-scaling margin, 0 to 30: the scale is divided by ``2**margin``.
    amax_history_len : int
        Rows of TE's amax history.
    amax_compute_algo : "max" | "most_recent"
        TE's amax selection: the largest amax of the history, or the newest.
    power_2_scales : bool
        Round scales down to a power of two (TE's mantissa mask, or torchao's
        ``exp2(floor(log2(s)))``).
    amax_epsilon : float
        The amax floor: TE's epsilon (float32), torchao's EPS (float64, 1e-12).
    rule : "te" | "torchao"
        Whose current-scaling rule turns an amax into a scale (see
        ``scale_from_amax``).
    amax_nan : "ignore" | "propagate"
        NaN elements skipped by the amax (TE's fmaxf reduction) or making it
        NaN (``torch.max``).
    saturate : bool
        e5m2 overflow and Inf saturate to +-57344 (else +-Inf); e4m3fn always
        saturates.
    nan_sign : bool
        A NaN's float8 code keeps its sign (torch: 0x7F or 0xFF), else it is
        always 0x7F (TE).
    source : str
        The library and version whose behaviour the recipe reproduces:
        "NVIDIA/TransformerEngine v2.18" or "pytorch/ao v0.18.0" for the
        presets ("" for a custom recipe).

    An invalid value is a ValueError (TypeError for a wrong type) naming the
    field, raised by the constructor; TE's rule refuses e5m2 for the forward
    tensors as TE refuses its fp8_format E5M2.  `source` has a default, so a
    dict written before it existed still loads (``from_dict``), and is not
    compared: it describes the parameters, so a state saved before it existed
    is the same recipe's.
    """

    name: str
    scaling: str
    granularity: str
    forward_format: str
    backward_format: str
    margin: int
    amax_history_len: int
    amax_compute_algo: str
    power_2_scales: bool
    amax_epsilon: float
    rule: str
    amax_nan: str
    saturate: bool
    nan_sign: bool
    source: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.source, str):
            raise TypeError(f"source must be a string, got {self.source!r}")
        choice("scaling", self.scaling, ("delayed", "current"))
        choice("granularity", self.granularity, ("tensor", "row"))
        choice("forward_format", self.forward_format, _FORMATS)
        choice("backward_format", self.backward_format, _FORMATS)
        choice("amax_compute_algo", self.amax_compute_algo, ("max", "most_recent"))
        choice("rule", self.rule, ("te", "torchao"))
        choice("amax_nan", self.amax_nan, ("ignore", "propagate"))
        fields = {
            "margin": integer("margin", self.margin, minimum=0),
            "amax_history_len": integer("amax_history_len", self.amax_history_len, minimum=1),
            "power_2_scales": boolean("power_2_scales", self.power_2_scales),
            "saturate": boolean("saturate", self.saturate),
            "nan_sign": boolean("nan_sign", self.nan_sign),
            "amax_epsilon": real("amax_epsilon", self.amax_epsilon),
        }
        if fields["margin"] > 30:
            raise ValueError(
                "margin must be <= 30 (beyond it fp8_max * 2**-margin / FLT_MAX can round to a "
                f"zero scale), got {self.margin!r}"
            )
        eps = fields["amax_epsilon"]
        if not math.isfinite(eps) or eps < 0 or eps > np.finfo(np.float32).max:
            raise ValueError(f"amax_epsilon must be finite and >= 0, got {self.amax_epsilon!r}")
        for k, v in fields.items():  # normalised: NumPy scalars become Python values
            object.__setattr__(self, k, v)
        if self.rule == "te":
            if (self.forward_format, self.backward_format) == ("e5m2", "e5m2"):
                raise ValueError(
                    "forward_format and backward_format must not both be 'e5m2' under rule "
                    "'te': pure E5M2 training is not supported (TE's fp8_format E5M2)"
                )
            if self.forward_format != "e4m3fn":
                raise ValueError(
                    "forward_format must be 'e4m3fn' under rule 'te' (TE's fp8_format E4M3 "
                    f"or HYBRID), got {self.forward_format!r}"
                )
        if self.scaling == "delayed":
            if self.rule != "te":
                raise ValueError(
                    "rule must be 'te' for delayed scaling (torchao removed delayed scaling "
                    f"in v0.10), got {self.rule!r}"
                )
            if self.granularity != "tensor":
                raise ValueError(
                    f"granularity must be 'tensor' for delayed scaling, got {self.granularity!r}"
                )
            if self.power_2_scales:
                raise ValueError(
                    "power_2_scales must be False for delayed scaling (TE's DelayedScaling "
                    "scales are plain float32), got True"
                )

    def fp8_max(self, fmt: str) -> float:
        """The largest finite value of format `fmt` ("e4m3fn" 448, "e5m2" 57344)."""
        return FP8_MAX[choice("fmt", fmt, _FORMATS)]

    def scale_from_amax(self, amax: Any, fmt: str | None = None) -> npt.NDArray[np.float32]:
        """The current-scaling scale of each amax, for format `fmt` (default forward_format).

        `amax` (a float or an array of any real dtype) is taken as float32; the
        result is a float32 array of its shape, computed by the compiled rule
        of ``rule``:

        - ``"te"``, TransformerEngine's ``compute_scale_from_amax``: an amax
          below ``amax_epsilon`` counts as ``amax_epsilon``; an amax that is
          Inf, 0 or NaN gives 1; else ``fp8_max / amax`` in float32, an
          overflow giving FLT_MAX, and with ``power_2_scales`` the mantissa
          bits cleared.
        - ``"torchao"``, torchao's ``amax_to_scale``: ``fp8_max /
          max(amax, amax_epsilon)`` in float64, rounded to float32 (Inf gives
          0, NaN NaN); with ``power_2_scales`` ``exp2(floor(log2(s)))`` as
          torch computes it in float32, so a scale a few ulps below 2**m
          gives 2**m.

        >>> import lscore.fp8
        >>> lscore.fp8.recipe("te-current").scale_from_amax([3.0, 0.0, float("inf")])
        array([149.33333,   1.     ,   1.     ], dtype=float32)
        >>> lscore.fp8.recipe("torchao-tensorwise").scale_from_amax([3.0, 0.0, float("inf")])
        array([1.4933333e+02, 4.4799999e+14, 0.0000000e+00], dtype=float32)
        """
        fmt = self.forward_format if fmt is None else fmt
        top = self.fp8_max(fmt)
        a = np.asarray(amax)
        if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
            raise TypeError(f"amax must be real numbers, got dtype {a.dtype}")
        a = np.asarray(a, dtype=np.float32, order="C")
        out = np.empty(a.shape, np.float32)
        if self.rule == "te":
            kernels.fp8_scale_te(a, out, top, self.power_2_scales, self.amax_epsilon)
        else:
            kernels.fp8_scale_torchao(a, out, top, self.power_2_scales, self.amax_epsilon)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-safe."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        """The recipe `to_dict` wrote; an unknown field, or a missing one that has no
        default, is a ValueError."""
        return cls(**exact_fields(cls, d, defaults=True))


def recipe(name: str, /, **overrides: Any) -> Recipe | blocks.BlockRecipe:
    """The preset `name` (one of ``RECIPES``), with any field replaced by `overrides`.

    A block-scaled preset name (one of ``BLOCK_RECIPES``) gives a
    ``BlockRecipe`` the same way.

    TE's presets also take ``fp8_format="HYBRID" | "E4M3"`` (forward e4m3fn,
    backward e5m2 or e4m3fn); ``"E5M2"`` is refused as TE refuses it.  An
    unknown name or field is a ValueError listing the known ones.

    >>> import lscore.fp8
    >>> r = lscore.fp8.recipe("te-delayed", margin=1, amax_history_len=16)
    >>> (r.margin, r.amax_history_len, r.amax_compute_algo, r.backward_format)
    (1, 16, 'max', 'e5m2')
    """
    if name not in TABLE:
        if name in blocks.BLOCK_TABLE:
            return blocks.block_recipe(name, **overrides)
        known = (*RECIPES, *blocks.BLOCK_RECIPES)
        raise ValueError(f"unknown recipe {name!r}; expected one of: {', '.join(known)}")
    te = TABLE[name]["rule"] == "te"
    fields = preset_fields(name, TABLE, overrides, te, ("forward_format", "backward_format"))
    return Recipe(**fields)
