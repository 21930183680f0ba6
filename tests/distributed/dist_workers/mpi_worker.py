"""One rank of an MPI test run: `mpirun -n N python mpi_worker.py MODE OUT_DIR`.

MODE: ``scenarios`` runs scenarios.run_all; ``die`` has the last rank exit
abruptly while the others wait in a reduce (mpirun must end the job);
``hang`` has it sleep instead (mpirun's --timeout must end the job).
Each rank writes OUT_DIR/rank<R>.json.
"""

import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from helpers.dist import scenarios  # tests/ is on PYTHONPATH (helpers.dist.launch)
from lscore.distributed import MPIReducer


class CountingComm:
    """A communicator that counts the collectives a reducer issues through it."""

    def __init__(self, comm, group):
        self._comm, self._group = comm, group

    def Get_size(self):
        return self._comm.Get_size()

    def Allreduce(self, *args, **kwargs):
        self._group.collectives += 1
        return self._comm.Allreduce(*args, **kwargs)

    def Allgather(self, *args, **kwargs):
        self._group.collectives += 1
        return self._comm.Allgather(*args, **kwargs)


class MPIGroup:
    """scenarios.Group over MPI.COMM_WORLD."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.collectives = 0
        self.reducer = MPIReducer(CountingComm(comm, self))

    def allreduce_sum(self, a):
        a = np.ascontiguousarray(a)
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op=MPI.SUM)
        return out

    def allgather(self, a):
        a = np.ascontiguousarray(a)
        out = np.empty((self.size, *a.shape), dtype=a.dtype)
        self.comm.Allgather(a, out)
        return out


def main():
    mode, out_dir = sys.argv[1:3]
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    if mode in ("die", "hang"):
        reducer = MPIReducer()
        reducer.reduce(False)  # everyone is up
        if rank == world - 1:
            if mode == "hang":
                time.sleep(3600)
            os._exit(3)
        reducer.reduce(True)  # never completes; mpirun ends the job
        result = {"error": None}
    else:
        result = scenarios.run_all(MPIGroup(comm))
        result["reducer"] = repr(MPIReducer())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
