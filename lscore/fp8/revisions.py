"""The library revisions ``lscore.fp8``'s presets reproduce: their names and ``source`` lines.

Every preset reproduces its library's pinned release: NVIDIA/TransformerEngine
v2.18 (tag v2.18, 27486e03cfc1), pytorch/ao v0.18.0 (5f2baf9d575c), and the
OCP Microscaling Formats v1.0 rule as microsoft/microxcaling 7bc41952 computes
it.  Where a library's next revision changed a rule that a preset follows, a
block recipe's ``revision`` field selects that revision (no release holds
either yet):

- NVIDIA/TransformerEngine#3262 (main at 4ff5fdfed0c1): ``ptx::exp2f``, the
  MXFP8 dequantize's read of an E8M0 byte, takes code 0 as 2**-127 and 0xFF as
  NaN (v2.18: +0.0 and +Inf);
- pytorch/ao#4725 (main at 5d73a0c10b02): the MX scale rules' non-finite
  amaxes, RCEIL's code and the elements' product (``lscore.kernels.mx_scale``
  lists the rules).
"""

from __future__ import annotations

__all__ = ["REVISIONS", "check_revision", "pinned"]

TE = "NVIDIA/TransformerEngine v2.18"
AO = "pytorch/ao v0.18.0"
OCP = "OCP Microscaling Formats v1.0 (microsoft/microxcaling 7bc41952)"

#: whose behaviour ("te", "torchao", "rule") -> the revisions of it a recipe can reproduce,
#: each with the ``source`` it gives: the pinned release first, then the next revision
REVISIONS: dict[str, dict[str, str]] = {
    "te": {"v2.18": TE, "4ff5fdfed0c1": "NVIDIA/TransformerEngine main at 4ff5fdfed0c1 (#3262)"},
    "torchao": {"v0.18.0": AO, "5d73a0c10b02": "pytorch/ao main at 5d73a0c10b02 (#4725)"},
    "rule": {"v1.0": OCP},
}


def pinned(behaviour: str) -> str:
    """The pinned release of a behaviour's library ("v2.18", "v0.18.0", "v1.0")."""
    return next(iter(REVISIONS[behaviour]))


def check_revision(revision: object, behaviour: str, mode: str, changed: bool) -> str:
    """`revision` as a recipe of `behaviour` and `mode` keeps it: one of
    ``REVISIONS[behaviour]`` ("" the pinned one), past the pinned one only where it
    `changed` the mode's rule; else a TypeError or ValueError saying what is allowed."""
    if not isinstance(revision, str):
        raise TypeError(f"revision must be a string, got {revision!r}")
    revs, first = REVISIONS[behaviour], pinned(behaviour)
    if revision == "":
        return first
    if revision not in revs:
        raise ValueError(
            f"revision must be one of {', '.join(revs)} under behaviour {behaviour!r}, "
            f"got {revision!r}"
        )
    if revision != first and not changed:
        raise ValueError(
            f"revision must be {first!r} under mode {mode!r} (revision {revision!r} changed "
            f"no rule of it), got {revision!r}"
        )
    return revision
