"""One rank of a torch.distributed test run
(started by tests/distributed/test_distributed_torch.py).

usage: torch_worker.py MODE RANK WORLD PORT OUT_DIR [BACKEND]

MODE: ``scenarios`` runs scenarios.run_all; ``die`` has the last rank exit
abruptly while the others wait in a reduce (they must fail, not hang);
``device`` records the backend and device the rank ran on after one reduce.
BACKEND: ``gloo`` (the CPU, the default), ``nccl`` (a GPU per rank, or the
rank exits saying so) or ``auto`` (helpers.dist.devices.pick: NCCL with a
GPU per rank, else gloo on the CPU).  All ranks run on this host, so RANK is
also the local rank.  Each rank writes OUT_DIR/rank<R>.json.
"""

import datetime
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from helpers.dist import devices, scenarios  # tests/ is on PYTHONPATH (helpers.dist.launch)
from lscore.distributed import TorchReducer

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)


class TorchGroup:
    """scenarios.Group over a torch process group; counts collectives."""

    def __init__(self, rank, size, device):
        self.rank, self.size, self.device = rank, size, device
        self.collectives = 0
        for name in ("all_reduce", "all_gather_single", "all_gather_into_tensor", "all_gather"):
            if hasattr(dist, name):
                setattr(dist, name, self._counted(getattr(dist, name)))
        self.reducer = TorchReducer()

    def _counted(self, fn):
        def wrapper(*args, **kwargs):
            self.collectives += 1
            return fn(*args, **kwargs)

        return wrapper

    def allreduce_sum(self, a):
        t = torch.from_numpy(np.array(a)).to(self.device)
        dist.all_reduce(t)
        return t.cpu().numpy()

    def allgather(self, a):
        t = torch.from_numpy(np.array(a)).to(self.device)
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t)
        return torch.stack(parts).cpu().numpy()


class _TorchStepper:
    """The scenario's scaled gradient becomes a torch parameter's ``.grad``; the
    subclass's ``_step`` unscales, asks the group, and steps or skips."""

    def __init__(self, group):
        self.group = group
        self.param = self.opt = None

    def step(self, g, w) -> dict:
        if self.param is None:
            self.param = torch.nn.Parameter(torch.zeros(w.shape))
            self.opt = torch.optim.SGD([self.param], lr=scenarios.LR)
            self._wrap()
        with torch.no_grad():
            self.param.copy_(torch.from_numpy(w))
        self.param.grad = torch.from_numpy(g.copy())
        found = not bool(torch.isfinite(self.param.grad).all())
        before = self.group.collectives
        applied = self._step()
        w[...] = self.param.detach().numpy()
        return {"found": found, "applied": applied, "collectives": self.group.collectives - before}


class GradScalerStepper(_TorchStepper):
    """lscore.adapters.torch.GradScaler(process_group=WORLD) stepping torch's SGD."""

    def __init__(self, group):
        from lscore.adapters.torch import GradScaler

        super().__init__(group)
        self.scaler = GradScaler(
            "cpu",
            init_scale=scenarios.POLICY["init_scale"],
            growth_interval=scenarios.POLICY["growth_interval"],
            process_group=dist.group.WORLD,
        )
        self.scaler.scale(torch.ones(()))  # the scale is made lazily, as by scale(loss)

    @property
    def scale(self) -> float:
        return self.scaler.get_scale()

    def _wrap(self):
        pass

    def _step(self) -> bool:
        self.scaler.step(self.opt)
        self.scaler.update()
        return not self.scaler.last_step_skipped

    def final(self) -> dict:
        return {
            "scale": self.scaler.get_scale(),
            "counters": {
                "skipped": self.scaler.skipped_steps,
                "tracker": self.scaler._get_growth_tracker(),
            },
        }


class TorchOptimizerStepper(_TorchStepper):
    """lscore.adapters.torch.LossScaleOptimizer(SGD, reducer=TorchReducer()), Keras shape."""

    def __init__(self, group):
        super().__init__(group)
        self.wrapped = None

    @property
    def scale(self) -> float:
        return scenarios.POLICY["init_scale"] if self.wrapped is None else self.wrapped.loss_scale

    def _wrap(self):
        from lscore.adapters.torch import LossScaleOptimizer

        self.wrapped = LossScaleOptimizer(
            self.opt,
            initial_scale=scenarios.POLICY["init_scale"],
            dynamic_growth_steps=scenarios.POLICY["growth_interval"],
            reducer=TorchReducer(),
        )

    def _step(self) -> bool:
        self.wrapped.step()
        return not self.wrapped.last_step_skipped

    def final(self) -> dict:
        return {
            "scale": self.wrapped.loss_scale,
            "counters": {
                "iterations": self.wrapped.iterations,
                "dynamic_counter": self.wrapped.dynamic_counter,
            },
        }


def main():
    mode, rank, world, port, out_dir = sys.argv[1:6]
    backend = sys.argv[6] if len(sys.argv) > 6 else "gloo"
    rank, world = int(rank), int(world)
    device = torch.device("cpu")
    if backend in ("nccl", "auto"):
        picked, device = devices.pick(rank, world)
        if backend == "nccl" and picked != "nccl":
            sys.exit(
                f"nccl needs a CUDA device per rank: {torch.cuda.device_count()} for {world} ranks"
            )
        backend = picked
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )
    try:
        if mode == "die":
            reducer = TorchReducer()
            reducer.reduce(False)  # everyone is up
            if rank == world - 1:
                os._exit(3)  # dies without a word
            try:
                reducer.reduce(True)
                result = {"error": None}
            except Exception as e:  # the point: it raises instead of hanging
                result = {"error": f"{type(e).__name__}: {e}"[:300]}
        elif mode == "device":
            reducer = TorchReducer()
            reducer.reduce(False)
            result = {"backend": dist.get_backend(), "device": str(reducer.device())}
        else:
            group = TorchGroup(rank, world, device)
            result = (
                {"reduce_basic": scenarios.reduce_basic(group)}
                if backend == "nccl"
                else scenarios.run_all(
                    group,
                    {
                        **scenarios.ADAPTERS,
                        "torch": GradScalerStepper,
                        "torch_optimizer": TorchOptimizerStepper,
                    },
                )
            )
            result["device"] = str(group.reducer.device())
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        if mode != "die":
            dist.destroy_process_group()
        # gloo's C++ teardown at interpreter exit can abort ("terminate called
        # without an active exception", SIGABRT): always for a group whose peer
        # died, now and then under load for a healthy one after
        # destroy_process_group; the verdict is written, so leave without it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException:
        if mode != "die" and dist.is_initialized():
            dist.destroy_process_group()
        raise


if __name__ == "__main__":
    main()
