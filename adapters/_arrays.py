"""``ArrayOptimizer``, the base of the array-module-generic SGD and Adam (``_sgd_adam``):
tf-keras's optimizer on arrays updated in place, its clipping, slots and state.

An adapter's subclass sets ``_xp`` (the array module: numpy, cupy).  It meets the
protocol the LossScaleOptimizer wrappers of _optim drive
(``apply_gradients(grads_and_vars)``), which a user's own optimizer may meet too.
"""

from __future__ import annotations

import math
from typing import Any

from lscore.adapters._grads import drop_none_gradients, grad_var_pairs
from lscore.adapters._optim import quiet
from lscore.adapters._wrapper import type_name
from lscore.policy import integer, real

_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


def _clip_arg(name: str, value: Any) -> float | None:
    if value is None:
        return None
    v = real(name, value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(
            f"{name} must be None or a finite number >= 0 (0 disables it), got {value!r}"
        )
    return v


def _describe(x: Any) -> str:
    return repr(x) if not isinstance(x, dict) else f"a dict with the keys {sorted(map(str, x))}"


def _check_slot(a: Any, shape: tuple, dtype: Any, i: int, name: str) -> None:
    if a.shape != shape or a.dtype != dtype:
        raise ValueError(
            f"variable {i}'s slot {name!r} in the state has shape {a.shape} and dtype "
            f"{a.dtype}; the variable has shape {shape} and dtype {dtype}: pass the "
            "variables in the order of the run that saved the state"
        )


class ArrayOptimizer:
    """Base of SGD and Adam: tf-keras's optimizer (TF >= 2.11) on arrays updated in place.

    ``apply_gradients(grads_and_vars)`` is the protocol a LossScaleOptimizer
    needs: it takes (gradient, variable) pairs, updates every variable in
    place, and advances ``iterations`` by one.  As in tf-keras: an empty list
    is a no-op; (None, var) pairs are dropped with a warning and an all-None
    list raises ValueError; gradients are clipped (``clipnorm`` per array, else
    ``global_clipnorm`` over all, else ``clipvalue``) before the update.
    Gradients are cast to their variable's dtype; slots (momentum, Adam's
    moments) are created on first use and kept per variable.
    """

    _xp: Any = None  # the array module, set by the adapter
    _learning_rate: float
    _clipnorm: float | None
    _global_clipnorm: float | None
    _clipvalue: float | None
    weight_decay: float | None
    iterations: int
    _slots: dict[int, tuple[Any, dict[str, Any]]]

    def __init__(
        self,
        learning_rate: Any,
        *,
        weight_decay: Any = None,
        clipnorm: Any = None,
        clipvalue: Any = None,
        global_clipnorm: Any = None,
        name: Any,
    ) -> None:
        if self._xp is None:
            raise TypeError(
                f"{type(self).__name__} is generic; use the one in "
                "lscore.adapters.numpy or lscore.adapters.cupy"
            )
        self.learning_rate = learning_rate
        clipnorm = _clip_arg("clipnorm", clipnorm)
        global_clipnorm = _clip_arg("global_clipnorm", global_clipnorm)
        if clipnorm is not None and global_clipnorm is not None:
            raise ValueError(
                "At most one of `clipnorm` and `global_clipnorm` can be set. "
                f"Received: clipnorm={clipnorm}, global_clipnorm={global_clipnorm}."
            )
        self._clipnorm, self._global_clipnorm = clipnorm, global_clipnorm
        self._clipvalue = _clip_arg("clipvalue", clipvalue)
        self.weight_decay = _clip_arg("weight_decay", weight_decay)
        self.name = name
        self.iterations = 0
        self._slots = {}  # id(variable) -> (variable, {slot name: array})

    @property
    def learning_rate(self) -> float:
        return self._learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        v = real("learning_rate", value)
        if not math.isfinite(v):
            raise ValueError(f"learning_rate must be finite, got {value!r}")
        self._learning_rate = v

    @property
    def clipnorm(self) -> float | None:
        return self._clipnorm

    @clipnorm.setter
    def clipnorm(self, value: Any) -> None:
        self._set_norm("clipnorm", value, other="global_clipnorm")

    @property
    def global_clipnorm(self) -> float | None:
        return self._global_clipnorm

    @global_clipnorm.setter
    def global_clipnorm(self, value: Any) -> None:
        self._set_norm("global_clipnorm", value, other="clipnorm")

    def _set_norm(self, name: str, value: Any, *, other: str) -> None:
        value = _clip_arg(name, value)
        if value is not None and getattr(self, "_" + other) is not None:
            raise ValueError("At most one of `clipnorm` and `global_clipnorm` can be set.")
        setattr(self, "_" + name, value)

    @property
    def clipvalue(self) -> float | None:
        return self._clipvalue

    @clipvalue.setter
    def clipvalue(self, value: Any) -> None:
        self._clipvalue = _clip_arg("clipvalue", value)

    def _as_grad(self, g: Any, v: Any) -> Any:
        xp = self._xp
        if not isinstance(v, xp.ndarray):
            raise TypeError(
                f"variables must be {xp.__name__}.ndarray (updated in place), got {type_name(v)}"
            )
        if str(v.dtype) not in _FLOAT_NAMES:
            raise TypeError(
                f"variables must have a floating dtype ({', '.join(_FLOAT_NAMES)}), got {v.dtype}"
            )
        if not getattr(v.flags, "writeable", True):
            raise ValueError("variables must be writable; got a read-only array")
        g = xp.asarray(g, dtype=v.dtype)
        if g.shape != v.shape:
            raise ValueError(f"gradient shape {g.shape} does not match variable shape {v.shape}")
        return g

    # slots of a loaded state (load_state_dict), each list bound to the next variable
    # that gets slots, in the order the saving optimizer's variables got theirs
    _pending: tuple = ()

    def _bind(self, variables: list) -> None:
        """Give the variables without slots yet the next loaded slots, in order; all are
        checked before any is bound (a mismatch is a ValueError that changes nothing)."""
        if not self._pending:
            return
        new, seen = [], set()
        for v in variables:
            entry = self._slots.get(id(v))
            if (entry is None or entry[0] is not v) and id(v) not in seen:
                new.append(v)
                seen.add(id(v))
        n = min(len(new), len(self._pending))
        for i, (v, slots) in enumerate(zip(new[:n], self._pending[:n], strict=True)):
            for name, a in slots.items():
                _check_slot(a, v.shape, v.dtype, len(self._slots) + i, name)
        for v, slots in zip(new[:n], self._pending[:n], strict=True):
            self._slots[id(v)] = (v, slots)
        self._pending = self._pending[n:]

    def _slots_of(self, v: Any) -> dict:
        """`v`'s slots by name, created empty (or from a loaded state) on first use."""
        self._bind([v])
        entry = self._slots.get(id(v))
        if entry is None or entry[0] is not v:
            entry = self._slots[id(v)] = (v, {})
        return entry[1]

    def _slot(self, v: Any, name: str) -> Any:
        slots = self._slots_of(v)
        if name not in slots:
            slots[name] = self._xp.zeros_like(v)
        return slots[name]

    def __setstate__(self, state: dict) -> None:
        # slots are keyed by id(variable): ids change when a checkpoint is unpickled
        self.__dict__.update(state)
        self._slots = {id(v): (v, slots) for v, slots in self._slots.values()}

    def state_dict(self) -> dict:
        """``{"class_name", "iterations", "slots"}``: the step count and, per variable in
        the order the variables first got slots (the order of the first step's
        variables), a dict of slot copies (``momentum``; Adam's ``m``, ``v``, ``vhat``)."""
        return {
            "class_name": type(self).__name__,
            "iterations": self.iterations,
            "slots": [{k: a.copy() for k, a in slots.items()} for _, slots in self._slots.values()],
        }

    def load_state_dict(self, d: Any) -> None:
        """Take a ``state_dict()`` of the same class.  An optimizer that already has slots
        gets the values copied into them (same arrays); a new one binds them to its
        variables as they come, in the order of the saving run's first step: pass the
        variables in that order (a shape or dtype that differs is a ValueError)."""
        if not isinstance(d, dict) or set(d) != {"class_name", "iterations", "slots"}:
            raise ValueError(
                "an optimizer state must be a dict with the keys 'class_name', 'iterations' "
                f"and 'slots' (from state_dict()), got {_describe(d)}"
            )
        if d["class_name"] != type(self).__name__:
            raise ValueError(
                f"the state was saved by {d['class_name']!r}; this optimizer is "
                f"{type(self).__name__!r}"
            )
        iterations = integer("iterations", d["iterations"], minimum=0)
        xp = self._xp
        if not isinstance(d["slots"], (list, tuple)) or not all(
            isinstance(x, dict) for x in d["slots"]
        ):
            raise TypeError(f"slots must be a list of dicts, got {_describe(d['slots'])}")
        loaded = tuple({k: xp.array(a) for k, a in x.items()} for x in d["slots"])
        mine = [slots for _, slots in self._slots.values()]
        if mine:
            if len(mine) != len(loaded):
                raise ValueError(
                    f"the state holds the slots of {len(loaded)} variables; this "
                    f"optimizer has slots for {len(mine)}"
                )
            for i, (have, got) in enumerate(zip(mine, loaded, strict=True)):
                if set(have) != set(got):
                    raise ValueError(
                        f"variable {i}'s slots are {sorted(got)} in the state, {sorted(have)} here"
                    )
                for k, a in have.items():
                    _check_slot(got[k], a.shape, a.dtype, i, k)
            for have, got in zip(mine, loaded, strict=True):
                for k, a in have.items():  # in place: the fused kernels keep their addresses
                    a[...] = got[k]
            self._pending = ()
        else:
            self._pending = loaded
        self.iterations = iterations

    def _clip(self, grads: list) -> list:
        xp = self._xp
        if self._clipnorm:
            out = []
            for g in grads:  # tf.clip_by_norm: g * c / max(||g||, c), in g's dtype
                c = g.dtype.type(self._clipnorm)
                out.append(g * c / xp.maximum(xp.sqrt(xp.sum(g * g)), c))
            return out
        if self._global_clipnorm:
            c = self._global_clipnorm
            norm = xp.sqrt(sum(xp.sum(g * g) for g in grads))
            with quiet():  # tf.clip_by_global_norm; a zero norm gives scale 1
                scale = c * xp.minimum(1.0 / norm, 1.0 / c) + (norm - norm)
            return [g * scale.astype(g.dtype) for g in grads]
        if self._clipvalue:
            return [xp.clip(g, -self._clipvalue, self._clipvalue) for g in grads]
        return grads

    def apply_gradients(self, grads_and_vars: Any) -> int:
        """Update every variable in place; returns ``iterations``."""
        pairs = grad_var_pairs(grads_and_vars)
        if not pairs:
            return self.iterations
        pairs = drop_none_gradients(pairs, warn=True)
        grads = [self._as_grad(g, v) for g, v in pairs]  # all checked before any update
        self._bind([v for _, v in pairs])
        for g, (_, v) in zip(self._clip(grads), pairs, strict=True):
            self._update_step(g, v)
        self.iterations += 1
        return self.iterations

    def _update_step(self, g: Any, v: Any) -> None:
        raise NotImplementedError

    def _decay(self, v: Any) -> None:
        """Decoupled weight decay, tf-keras's ``_apply_weight_decay``: v -= v * wd * lr."""
        if self.weight_decay:
            t = v.dtype.type
            v -= v * t(self.weight_decay) * t(self._learning_rate)

    def get_config(self) -> dict:
        return {
            "name": self.name,
            "learning_rate": self._learning_rate,
            "weight_decay": self.weight_decay,
            "clipnorm": self._clipnorm,
            "global_clipnorm": self._global_clipnorm,
            "clipvalue": self._clipvalue,
        }

    @classmethod
    def from_config(cls, config: dict) -> Any:
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"
