"""One skip decision for every worker: the found-inf flag OR-ed across a group.

A *reducer* is any object with one method::

    reduce(found_inf: bool, stats=None) -> (found_inf: bool, stats)

It returns the OR of ``found_inf`` over every worker of its group and, when
``stats`` is given, the group-wide statistics: sums added, maxima maxed.
``stats`` is either the pair ``(sumsq, max_abs)`` or a dict whose keys start
with ``"sum"`` (added) or ``"max"`` (maxed), e.g.
``{"sumsq": 12.5, "max_abs": 3.0}``; the result has the same shape.

Every worker must call ``reduce`` once per step, in the same order (it is a
collective).  With a world of one worker no collective runs.

One collective per call
-----------------------
The flag alone travels in one ``all_reduce(MAX)`` of one integer.  With
statistics, no single reduction operator is both a sum and a maximum (torch
has no user-defined operators, and a MAX cannot add), so the reducers
all-gather one small row ``[flag, sums..., maxima...]`` per worker instead and
fold the rows locally.  That is still one collective, exact, and every worker
folds the same rows in the same order, so all of them get the same bits (an
all-reduce SUM does not promise that).  The rows are a few float64 values per
worker: for any realistic world size this is as cheap as a reduction.

``TorchReducer`` uses ``torch.distributed`` (gloo on CPU, NCCL on GPU, any
other backend through ``device=``); ``MPIReducer`` uses mpi4py, for NumPy and
CuPy training loops.  Neither framework is imported until a reducer is made.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lscore.policy import real

__all__ = ["MPIReducer", "TorchReducer", "check_reducer", "reduce_found_inf", "reduce_max"]


def check_reducer(reducer: Any) -> Any:
    """`reducer` itself when it is None or has a callable ``reduce``; TypeError otherwise."""
    if reducer is not None and not callable(getattr(reducer, "reduce", None)):
        raise TypeError(
            "reducer must have a method reduce(found_inf, stats=None) -> "
            f"(found_inf, stats), got {type(reducer).__name__}"
        )
    return reducer


def reduce_found_inf(reducer: Any, found_inf: bool) -> bool:
    """The group-wide found-inf flag (`found_inf` itself when `reducer` is None)."""
    if reducer is None:
        return bool(found_inf)
    return bool(reducer.reduce(bool(found_inf))[0])


def reduce_max(reducer: Any, values: Any) -> np.ndarray:
    """The elementwise maximum of `values` (a 1-d float array) over the reducer's group, in
    one ``reduce`` call (a NaN on any worker wins); `values` itself when `reducer` is None.

    The values travel as the statistics ``{"max0": ..., "max1": ...}`` (float64 holds every
    float32 exactly); the result has the dtype of `values`.
    """
    values = np.asarray(values)
    if reducer is None:
        return values
    keys = [f"max{i}" for i in range(values.size)]
    _, stats = reducer.reduce(False, dict(zip(keys, values.ravel().tolist(), strict=True)))
    return np.array([stats[k] for k in keys], dtype=values.dtype).reshape(values.shape)


class _Layout:
    """Where each statistic sits in a worker's row, and how rows fold."""

    __slots__ = ("keys", "n_sum")

    def __init__(self, keys: Any, n_sum: Any) -> None:
        self.keys = keys  # None for the (sumsq, max_abs) pair, else dict keys (sums first)
        self.n_sum = n_sum

    def fold(self, rows: list) -> tuple[bool, Any]:
        """(found_inf, stats) from the workers' rows (lists of floats), in rank order.

        Plain Python on a few numbers: faster than NumPy at this size, and the
        sums run in rank order on every worker, so all get the same bits.
        """
        found = any(row[0] != 0 for row in rows)
        columns = list(zip(*rows, strict=True))[1:]
        values = [sum(c) for c in columns[: self.n_sum]]
        # max() would drop a NaN that is not first; a NaN maximum must reach everyone
        values += [math.nan if any(v != v for v in c) else max(c) for c in columns[self.n_sum :]]
        if self.keys is None:
            return found, tuple(values)
        return found, dict(zip(self.keys, values, strict=True))


def _pack(found_inf: Any, stats: Any) -> tuple[Any, list[float]]:
    """(layout, row) for `stats`; the row is [flag, sums..., maxima...] as floats."""
    if isinstance(stats, dict):
        sums: list[tuple[str, float]] = []
        maxima: list[tuple[str, float]] = []
        for key, value in stats.items():
            if not isinstance(key, str) or not key.startswith(("sum", "max")):
                raise ValueError(
                    f"stats keys must start with 'sum' (added) or 'max' (maxed), got {key!r}"
                )
            (sums if key.startswith("sum") else maxima).append(
                (key, real(f"stats[{key!r}]", value))
            )
        items = sums + maxima
        layout = _Layout(tuple(k for k, _ in items), len(sums))
        values = [v for _, v in items]
    elif isinstance(stats, (tuple, list)):
        if len(stats) != 2:
            raise ValueError(
                f"stats as a sequence must be (sumsq, max_abs), got {len(stats)} values"
            )
        layout = _Layout(None, 1)
        values = [real("stats[0] (sumsq)", stats[0]), real("stats[1] (max_abs)", stats[1])]
    else:
        raise TypeError(
            f"stats must be None, a (sumsq, max_abs) tuple or a dict, got {type(stats).__name__}"
        )
    return layout, [1.0 if found_inf else 0.0, *values]


def _local(found_inf: Any, stats: Any) -> tuple[bool, Any]:
    """What a world of one returns: the inputs, validated and normalised."""
    if stats is None:
        return found_inf, None
    layout, row = _pack(found_inf, stats)
    return layout.fold([row])


class TorchReducer:
    """Reducer over a ``torch.distributed`` process group.

    Parameters
    ----------
    process_group : ProcessGroup, optional
        The group to agree over; None means the default (world) group.  When
        None and ``torch.distributed`` is not initialised, the reducer acts as
        a world of one (no collective), so the same code runs single-process.
    device : torch.device or str, optional
        Where the collective's tensor lives.  By default ``cuda`` (the current
        device) for an NCCL group and ``cpu`` otherwise.

    Examples
    --------
    >>> reducer = TorchReducer()                     # doctest: +SKIP
    >>> found_inf, stats = reducer.reduce(local_inf, {"sumsq": s, "max_abs": m})  # doctest: +SKIP
    """

    def __init__(self, process_group: Any = None, *, device: Any = None) -> None:
        import torch

        self.process_group = process_group
        self._device = None if device is None else torch.device(device)

    def __repr__(self) -> str:
        return f"TorchReducer(process_group={self.process_group!r})"

    def world_size(self) -> int:
        """The group's size (1 when there is no group to talk to)."""
        import torch.distributed as dist

        if self.process_group is None and not (dist.is_available() and dist.is_initialized()):
            return 1
        n = dist.get_world_size(self.process_group)
        if n < 1:
            raise RuntimeError("this process is not a member of the reducer's process_group")
        return n

    def device(self) -> Any:  # a torch.device (torch is imported when called)
        """The device of the collective's tensors."""
        if self._device is None:
            import torch
            import torch.distributed as dist

            backend = str(dist.get_backend(self.process_group)).lower()
            self._device = (
                torch.device("cuda", torch.cuda.current_device())
                if backend == "nccl"
                else torch.device("cpu")
            )
        return self._device

    def reduce(self, found_inf: Any, stats: Any = None) -> tuple[bool, Any]:
        """OR of `found_inf` over the group, and the group's `stats`; see the module doc."""
        found_inf = bool(found_inf)
        world = self.world_size()
        if world == 1:
            return _local(found_inf, stats)
        import torch
        import torch.distributed as dist

        group = self.process_group
        if stats is None:
            flag = torch.tensor([int(found_inf)], dtype=torch.int32, device=self.device())
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
            return bool(flag.item()), None
        layout, row = _pack(found_inf, stats)
        mine = torch.tensor(row, dtype=torch.float64, device=self.device())
        rows = torch.empty(world * len(row), dtype=torch.float64, device=mine.device)
        # torch >= 2.13 renamed all_gather_into_tensor to all_gather_single
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(rows, mine, group=group)
        return layout.fold(rows.view(world, len(row)).tolist())


class MPIReducer:
    """Reducer over an MPI communicator (mpi4py).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm, optional
        The communicator to agree over; None means ``MPI.COMM_WORLD``.  Any
        object with ``Get_size``, ``Allreduce`` and ``Allgather`` taking NumPy
        buffers will do.

    Notes
    -----
    Launch with ``mpirun -n N python train.py``.  The flag and statistics are
    host values, so this serves NumPy and CuPy loops alike.
    """

    def __init__(self, comm: Any = None) -> None:
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        self.comm = comm

    def __repr__(self) -> str:
        return f"MPIReducer(comm={self.comm!r})"

    def world_size(self) -> int:
        """The communicator's size."""
        return int(self.comm.Get_size())

    def reduce(self, found_inf: Any, stats: Any = None) -> tuple[bool, Any]:
        """OR of `found_inf` over the communicator, and its `stats`; see the module doc."""
        found_inf = bool(found_inf)
        world = self.world_size()
        if world == 1:
            return _local(found_inf, stats)
        from mpi4py import MPI

        if stats is None:
            flag = np.array([int(found_inf)], dtype=np.int32)
            out = np.empty_like(flag)
            self.comm.Allreduce(flag, out, op=MPI.MAX)
            return bool(out[0]), None
        layout, row = _pack(found_inf, stats)
        rows = np.empty((world, len(row)), dtype=np.float64)
        self.comm.Allgather(np.array(row, dtype=np.float64), rows)
        return layout.fold(rows.tolist())
