"""Record real training checkpoints that hold a GradScaler state, for tests/core/test_migrate.py.

Run in a throwaway virtualenv (Lightning and accelerate are never dependencies of lscore):
    python3 -m venv /tmp/peers-mig
    SITE=/tmp/peers-mig/lib/python3.11/site-packages   # torch 2.13 from lscore's test venv:
    .venv-test/bin/python -c "import site; print(site.getsitepackages()[0])" > $SITE/t.pth
    /tmp/peers-mig/bin/pip install lightning accelerate
    /tmp/peers-mig/bin/python tests/core/data/record_checkpoints.py
Each tool trains a Linear(4, 1) in fp16 autocast on the CPU for 12 steps, two of
which overflow, with torch.amp.GradScaler("cpu", init_scale=1024, growth_interval=3),
and saves its checkpoint the way it does:
- lightning.ckpt: Trainer(plugins=[MixedPrecision("16-mixed", "cpu", scaler=...)]).fit,
  then trainer.save_checkpoint (the scaler's state under the plugin's class name);
- accelerate_scaler.pt: Accelerator.save_state's scaler.pt.  accelerate makes no
  GradScaler on the CPU, so the test's scaler is set as Accelerator.scaler before
  prepare(), which hands it to the AcceleratedOptimizer (accelerator.py).
Both go to tests/core/data/checkpoints/, where checkpoints.json holds each tool's
version and its scaler.state_dict() at the save.
"""

import json
import os
import pathlib
import shutil
import tempfile

import accelerate
import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

HERE = pathlib.Path(__file__).parent / "checkpoints"


def inputs():
    xs = torch.ones(12, 4)
    xs[3], xs[7] = 1e30, float("inf")
    return xs


def scaler():
    return torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        return self.layer(batch[0]).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def lightning():
    torch.manual_seed(0)
    s = scaler()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=s)],
    )
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs()), batch_size=1)
    trainer.fit(Model(), data)
    trainer.save_checkpoint(HERE / "lightning.ckpt")
    return {"version": L.__version__, "file": "lightning.ckpt", "scaler": s.state_dict()}


def accelerate_state():
    torch.manual_seed(0)
    acc = accelerate.Accelerator(cpu=True, mixed_precision="fp16")
    acc.scaler = scaler()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    model, opt = acc.prepare(model, opt)
    for x in inputs():
        with acc.autocast():
            loss = model(x[None]).float().pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    out = tempfile.mkdtemp()
    try:
        acc.save_state(out)
        shutil.copy(os.path.join(out, "scaler.pt"), HERE / "accelerate_scaler.pt")
    finally:
        shutil.rmtree(out)
    return {
        "version": accelerate.__version__,
        "file": "accelerate_scaler.pt",
        "scaler": acc.scaler.state_dict(),
    }


def main():
    record = {
        "torch": torch.__version__,
        "lightning": lightning(),
        "accelerate": accelerate_state(),
    }
    (HERE / "checkpoints.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
