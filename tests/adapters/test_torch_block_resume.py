"""A torch training run under each block preset of the 2026 recipes (blockwise FP8, MXFP8 with
32x32 weight tiles, TE's NVFP4), checkpointed mid-run and resumed into new objects (a new
model and optimizer, built under another random seed), continues bitwise."""

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

import lscore.fp8
from lscore.adapters.torch.fp8 import convert_to_float8

PRESETS = {
    "te-blockwise": "te-blockwise",
    "torchao-blockwise": "torchao-blockwise",
    "te-mxfp8 weight_block=32": lscore.fp8.recipe("te-mxfp8", weight_block=32),
    "torchao-mx-rceil weight_block=32": lscore.fp8.recipe("torchao-mx-rceil", weight_block=32),
    "te-nvfp4": "te-nvfp4",
}


def _model():
    return torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128)
    )


def _steps(model, opt, batches):
    for x, target in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        torch.nn.functional.mse_loss(out.float(), target).backward()
        opt.step()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_resumed_run_is_the_uninterrupted_one(name):
    recipe = PRESETS[name]
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(128, 128, generator=gen), torch.randn(128, 128, generator=gen))]
    batches *= 4
    torch.manual_seed(2)
    model = convert_to_float8(_model(), recipe)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _steps(model, opt, batches[:2])
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    before = [p.detach().clone() for p in model.parameters()]
    _steps(model, opt, batches[2:])

    buf.seek(0)
    ckpt = torch.load(buf)
    torch.manual_seed(3)  # other initial weights, other stream seeds: the checkpoint rules
    fresh = convert_to_float8(_model(), recipe)
    fresh.load_state_dict(ckpt["model"])
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_opt.load_state_dict(ckpt["opt"])
    _steps(fresh, fresh_opt, batches[2:])
    for a, b, c in zip(model.parameters(), fresh.parameters(), before, strict=True):
        assert not torch.equal(a, c)  # the last steps moved the weights
        np.testing.assert_array_equal(b.detach().view(torch.int32), a.detach().view(torch.int32))
