"""``Gated``: the base of the CuPy adapter's SGD and Adam, whose elementwise step a device
boolean can gate.

The optimizers of ``_sgd_adam`` on a backend's device arrays (``_backend``, an
``ArrayBackend``).  Inside ``gated(gate)``, with `gate` a 0-d device boolean, each
variable's step runs, then the variable and its slots are restored from copies where
the gate is false: a skipped step changes nothing, and the host waits for nothing.
The sync-free LossScaleOptimizer gates the steps the fused kernels (``_fused``) do
not take this way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

from lscore.adapters import _arrays
from lscore.adapters._backend import ArrayBackend


class Gated(_arrays.ArrayOptimizer):
    """An ``ArrayOptimizer`` on device arrays (``_backend``) whose elementwise step
    ``gated(gate)`` makes conditional on a 0-d device boolean, with no host sync."""

    _gate = None
    _backend: ClassVar[ArrayBackend]  # set by the adapter's subclass

    @property
    def _xp(self) -> Any:
        backend = getattr(self, "_backend", None)
        return None if backend is None else backend.xp

    def _update_step(self, g: Any, v: Any) -> None:
        gate = self._gate
        if gate is None:
            return super()._update_step(g, v)
        xp = self._xp
        entry = self._slots.get(id(v))
        before = {k: s.copy() for k, s in entry[1].items()} if entry and entry[0] is v else {}
        old = v.copy()
        super()._update_step(g, v)
        keep = xp.logical_not(gate)
        xp.copyto(v, old, where=keep)
        for k, s in self._slots.get(id(v), (None, {}))[1].items():
            xp.copyto(s, before[k] if k in before else xp.zeros_like(s), where=keep)
        return None

    @contextlib.contextmanager
    def gated(self, gate: Any) -> Iterator[None]:
        """Within the block, steps take the elementwise path and keep a variable and its
        slots only where `gate` (a 0-d device boolean) is true: a skipped step restores
        copies, with no host sync.  ``Fused.fused_plan`` answers None meanwhile."""
        self._gate = gate
        try:
            yield
        finally:
            self._gate = None
