"""GradScaler under torch.compile: no more graph breaks than torch's own scaler, the
eager step's numbers bitwise, no warnings; dynamo stays unimported until compiling."""

import logging
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")
from helpers import torch_keys
from lscore.adapters.torch import GradScaler

INF = float("inf")
# the third input makes every gradient non-finite: that step is skipped and backs off
INPUTS = [1.0, 0.5, INF, 2.0, 1.0]


def make(scaler_cls, clip=False, device="cpu"):
    """A model, its optimizer and scaler, and the training step that uses them (the
    one torch's GradScaler docs show, forward under autocast in float16; with `clip`,
    lscore's unscale_and_clip_ before the step)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(
        device
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # growth_interval=2: the scale grows within the five steps as well as backing off
    scaler = scaler_cls(device, init_scale=2.0**8, growth_interval=2)
    x = torch.randn(32, 8).to(device)

    def step(k):
        with torch.autocast(device, dtype=torch.float16):
            loss = model(x * k).float().pow(2).mean()
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_and_clip_(opt, 0.5)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss

    return model, scaler, step


@pytest.fixture
def fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


def explained(scaler_cls):
    _, _, step = make(scaler_cls)
    dynamo.reset()
    return dynamo.explain(step)(torch.tensor(1.0))


# torch's own scaler, compiled, warns of torch.jit deprecations (lscore's does not: below)
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
def test_no_more_graph_breaks_than_torchs_scaler(fresh_dynamo):
    theirs = explained(torch.amp.GradScaler)
    ours = explained(GradScaler)
    assert ours.graph_break_count <= theirs.graph_break_count
    assert len(ours.break_reasons) <= len(theirs.break_reasons)
    # each break is the call into the scaler, as with torch's (whose methods dynamo skips)
    for reason in ours.break_reasons:
        assert "disable" in reason.reason


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def run(step, steps):
    for k in steps:
        step(torch.tensor(k))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("clip", [False, True])
def test_compiled_step_is_the_eager_step_bitwise(fresh_dynamo, clip, device):
    eager_model, eager_scaler, eager_step = make(GradScaler, clip, device)
    model, scaler, step = make(GradScaler, clip, device)
    compiled = torch.compile(step, backend="eager")
    # what would be printed: warnings as shown ("always": also those shown before in this
    # process; not "error", which would raise the ones dynamo hides on purpose), and
    # what dynamo logs instead of warning
    logged = _Records()
    torch_log = logging.getLogger("torch")
    torch_log.addHandler(logged)
    try:
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            for k in INPUTS:
                compiled(torch.tensor(k))
                eager_step(torch.tensor(k))
                assert scaler.get_scale() == eager_scaler.get_scale()
                assert scaler.last_step_skipped == eager_scaler.last_step_skipped
                for a, b in zip(model.parameters(), eager_model.parameters(), strict=True):
                    assert torch.equal(a, b)
    finally:
        torch_log.removeHandler(logged)
    assert [str(w.message) for w in shown] == []
    assert [r.getMessage() for r in logged.records] == []
    # the steps did what the test means them to: 256 grows to 512 after two finite
    # steps, the inf one backs off to 256, two more finite steps grow it to 512
    assert scaler.skipped_steps == 1
    assert scaler.get_scale() == 2.0**9
    assert scaler.state_dict() == eager_scaler.state_dict()


def test_compiled_step_matches_torchs_scaler(fresh_dynamo):
    theirs_model, theirs, theirs_step = make(torch.amp.GradScaler)
    model, scaler, step = make(GradScaler)
    run(torch.compile(step, backend="eager"), INPUTS)
    run(theirs_step, INPUTS)
    assert torch_keys(scaler.state_dict()) == theirs.state_dict()
    for a, b in zip(model.parameters(), theirs_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_eager_use_does_not_import_dynamo():
    """torch.compiler.disable imports dynamo (about a second): the adapter defers it to
    the first call from compiled code, so importing it and scaling eagerly do not pay.
    (Constructing a torch.optim optimizer imports dynamo itself: a bare param_groups
    holder stands in for one.)"""
    code = (
        "import sys, torch\n"
        "from lscore.adapters.torch import GradScaler\n"
        "w = torch.ones(3, requires_grad=True)\n"
        "class Opt: param_groups = [{'params': [w]}]\n"
        "s = GradScaler('cpu')\n"
        "s.scale((w * w).sum()).backward()\n"
        "s.unscale_(Opt()); s.update(); s.get_scale()\n"
        "assert w.grad.tolist() == [2.0, 2.0, 2.0], w.grad\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
