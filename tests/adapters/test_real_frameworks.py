"""Issue 17 with the real frameworks: Lightning and accelerate train with lscore's GradScaler.

Each test fits, checkpoints and resumes through the framework's own entry points
(``Trainer.fit(ckpt_path=...)``, Fabric's ``save`` / ``load``,
``Accelerator.save_state`` / ``load_state``) and
compares the run with the same run on ``torch.amp.GradScaler("cpu")``: the scale
after every step, which steps were skipped, and the parameters, bitwise.  Two
planted overflows per epoch: a 1e30 input (finite in float32, inf in float16
under autocast) and an inf input.

Neither framework type-checks the scaler at run time (Lightning 2.6.6 and
accelerate 1.15.0 only annotate ``torch.amp.GradScaler``); the isinstance checks
here are what a type-checking caller would see.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")
accelerate = pytest.importorskip("accelerate")

from accelerate.state import AcceleratorState
from lightning.pytorch.plugins.precision import MixedPrecision

from lscore.adapters.torch import GradScaler

TorchScaler = torch.amp.GradScaler
BAD = (2, 5)  # the batches that overflow, in every epoch
SCALER_ARGS = dict(init_scale=2.0**10, growth_interval=2)


def _inputs(n=8, overflow=True):
    xs = torch.linspace(-1.0, 1.0, n * 4).reshape(n, 4)
    if overflow:
        xs[BAD[0]], xs[BAD[1]] = 1e30, float("inf")
    return xs


def _same_parameters(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


# ---- Lightning ---------------------------------------------------------------------------


class _Module(L.LightningModule):
    """A Linear(4, 1) trained by SGD; ``dtype`` autocasts inside the step when given
    (a module that runs its own bfloat16 region under the fp16 plugin)."""

    def __init__(self, dtype=None):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.dtype_inside = dtype

    def training_step(self, batch, i):
        if self.dtype_inside is None:
            return self.layer(batch[0]).float().pow(2).mean()
        with torch.autocast("cpu", dtype=self.dtype_inside):
            return self.layer(batch[0]).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class _Record(L.Callback):
    """Per step: the scale after update() and whether the parameters moved."""

    def __init__(self):
        self.scales, self.moved = [], []

    def on_train_batch_start(self, trainer, module, batch, i):
        self._before = [p.detach().clone() for p in module.parameters()]

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        self.scales.append(trainer.precision_plugin.scaler.get_scale())
        self.moved.append(not _same_parameters(self._before, module.parameters()))


def _fit(scaler, epochs, root, ckpt_path=None, save=None, dtype=None, **trainer_kw):
    """``Trainer(plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])`` fit.

    The plugin is the only way to fp16 autocast on the CPU: ``Trainer(precision=
    "16-mixed", plugins=[MixedPrecision(...)])`` raises "Received both", and
    ``Trainer(accelerator="cpu", precision="16-mixed")`` alone switches to
    bf16-mixed (lightning/pytorch/trainer/connectors/accelerator_connector.py)."""
    record, module = _Record(), _Module(dtype)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        default_root_dir=root,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
        **trainer_kw,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
    )
    # with no scaler to skip them, overflowing steps would turn the parameters to NaN
    xs = _inputs(overflow=dtype is None)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs), batch_size=1)
    with warnings.catch_warnings():
        # Lightning's advice on DataLoader workers, and the auto scaler's own note
        warnings.simplefilter("ignore")
        trainer.fit(module, data, ckpt_path=ckpt_path)
    if save is not None:
        trainer.save_checkpoint(save)
    return [p.detach().clone() for p in module.parameters()], record, trainer


def test_lightning_takes_fp16_on_the_cpu_only_through_the_plugin():
    """Why the tests pass the plugin and no ``precision=``: the two other spellings."""
    with pytest.raises(ValueError, match="Received both"):
        L.Trainer(
            accelerator="cpu",
            precision="16-mixed",
            logger=False,
            plugins=[MixedPrecision("16-mixed", "cpu", scaler=GradScaler("cpu"))],
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(accelerator="cpu", precision="16-mixed", logger=False)
    assert trainer.precision_plugin.precision == "bf16-mixed"


def _unmoved(accumulate: int) -> list[int]:
    """The batches of a two-epoch run after which the parameters are as before: those
    that end no accumulation group, and those that end a group holding an overflow."""
    bad_groups = {b // accumulate for b in BAD}
    return [
        e * 8 + b
        for e in range(2)
        for b in range(8)
        if (b + 1) % accumulate or b // accumulate in bad_groups
    ]


@pytest.mark.parametrize(
    "kw",
    [{}, dict(gradient_clip_val=0.05), dict(accumulate_grad_batches=2)],
    ids=["plain", "clip", "accumulate"],
)
def test_lightning_fit_matches_torchs_scaler(tmp_path, kw):
    """Lightning's MixedPrecision plugin drives scale / unscale_ / step / update
    (lightning/pytorch/plugins/precision/amp.py; with ``gradient_clip_val`` it clips
    the gradients unscale_ left, between the two; with ``accumulate_grad_batches``
    it scales every backward and steps every k-th batch): same scales, same skips,
    same parameters as with torch's scaler."""
    ours = GradScaler("cpu", **SCALER_ARGS)
    p_torch, r_torch, _ = _fit(TorchScaler("cpu", **SCALER_ARGS), 2, tmp_path, **kw)
    p_ours, r_ours, trainer = _fit(ours, 2, tmp_path, **kw)
    assert trainer.precision_plugin.scaler is ours
    assert isinstance(trainer.precision_plugin.scaler, TorchScaler)
    assert r_ours.scales == r_torch.scales
    assert r_ours.moved == r_torch.moved
    assert [i for i, moved in enumerate(r_ours.moved) if not moved] == _unmoved(
        kw.get("accumulate_grad_batches", 1)
    )
    assert ours.skipped_steps == 4
    assert len(set(r_ours.scales)) > 2  # grew and backed off
    assert _same_parameters(p_ours, p_torch)
    assert ours.state_dict() == trainer.precision_plugin.state_dict()


LSCORE_OPTIONS = dict(SCALER_ARGS, hysteresis=2, min_scale=2.0**9)


@pytest.mark.parametrize(
    "saver, kw",
    [
        (GradScaler, SCALER_ARGS),
        (TorchScaler, SCALER_ARGS),
        (GradScaler, LSCORE_OPTIONS),
        (GradScaler, dict(SCALER_ARGS, enabled="auto")),
    ],
    ids=["lscore-ckpt", "torch-ckpt", "lscore-options-ckpt", "auto-fp16"],
)
def test_lightning_resume_continues_as_the_uninterrupted_run(tmp_path, saver, kw):
    """``trainer.save_checkpoint`` after one epoch stores the scaler's state under
    "MixedPrecision"; a fresh Trainer with a fresh lscore scaler resumes from it with
    ``fit(ckpt_path=...)`` and ends bitwise where one uninterrupted two-epoch run ends,
    whichever scaler wrote the checkpoint.  With lscore's own options the state dict
    also holds the "lscore" key (hysteresis and floor counters), which Lightning's
    checkpoint keeps and loads back.  An ``enabled="auto"`` scaler that saw float16
    stays enabled, and its fresh twin loads the state before its first scale()
    (Lightning restores before training) and then decides the same way."""
    p_full, r_full, _ = _fit(GradScaler("cpu", **kw), 2, tmp_path / "full")
    ckpt = tmp_path / "one-epoch.ckpt"
    _, r_first, _ = _fit(saver("cpu", **kw), 1, tmp_path / "first", save=ckpt)
    stored = torch.load(ckpt, weights_only=True)["MixedPrecision"]
    assert stored["scale"] == r_first.scales[-1] != SCALER_ARGS["init_scale"]
    assert ("lscore" in stored) == (kw is LSCORE_OPTIONS)
    fresh = GradScaler("cpu", **kw)
    p_resumed, r_resumed, _ = _fit(fresh, 2, tmp_path / "resumed", ckpt_path=ckpt)
    assert fresh.is_enabled()
    assert r_first.scales + r_resumed.scales == r_full.scales
    assert r_first.moved + r_resumed.moved == r_full.moved
    assert _same_parameters(p_resumed, p_full)


def test_lightning_auto_scaler_disabled_by_bfloat16_resumes_auto(tmp_path):
    """enabled="auto" under the fp16 plugin with a module that computes its loss in
    bfloat16: the scaler disables itself at the first scale(); its state dict is {},
    which Lightning does not store (checkpoint_connector.py: ``if
    prec_plugin_state_dict``), so a fresh auto scaler resumes with nothing to load,
    decides again, and the run ends where the uninterrupted one ends."""

    def auto():
        return GradScaler("cpu", enabled="auto")

    p_full, _, t_full = _fit(auto(), 2, tmp_path / "full", dtype=torch.bfloat16)
    assert not t_full.precision_plugin.scaler.is_enabled()
    ckpt = tmp_path / "one-epoch.ckpt"
    _fit(auto(), 1, tmp_path / "first", save=ckpt, dtype=torch.bfloat16)
    assert "MixedPrecision" not in torch.load(ckpt, weights_only=True)
    fresh = auto()
    assert fresh.is_enabled()  # undecided until its first scale()
    p_resumed, r_resumed, _ = _fit(
        fresh, 2, tmp_path / "resumed", ckpt_path=ckpt, dtype=torch.bfloat16
    )
    assert not fresh.is_enabled() and r_resumed.scales == [1.0] * 8
    assert _same_parameters(p_resumed, p_full)


class _Manual(_Module):
    """Manual optimization: ``manual_backward`` scales (the plugin's pre_backward), and
    ``opt.step()`` goes through the plugin's optimizer_step: unscale_, step, update."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, i):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.layer(batch[0]).float().pow(2).mean())
        opt.step()


def test_lightning_manual_optimization_matches_torchs_scaler(tmp_path):
    runs = []
    for cls in (TorchScaler, GradScaler):
        record, module = _Record(), _Manual()
        trainer = L.Trainer(
            accelerator="cpu",
            max_epochs=2,
            default_root_dir=tmp_path,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[record],
            plugins=[MixedPrecision("16-mixed", "cpu", scaler=cls("cpu", **SCALER_ARGS))],
        )
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(_inputs()), batch_size=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, data)
        runs.append((record, [p.detach().clone() for p in module.parameters()]))
    (r_torch, p_torch), (r_ours, p_ours) = runs
    assert r_ours.scales == r_torch.scales and r_ours.moved == r_torch.moved
    assert r_ours.moved.count(False) == 4
    assert _same_parameters(p_ours, p_torch)


def _fabric_run(scaler, steps, root, start=0, load=None, save=None, clip=None):
    """``Fabric(plugins=[MixedPrecision("16-mixed", "cpu", scaler=...)])``: ``backward``
    scales, the wrapped optimizer's ``step`` calls ``scaler.step`` and ``update``
    (lightning/fabric/plugins/precision/amp.py), ``clip_gradients`` unscales first;
    ``fabric.save`` / ``load`` keep the scaler as any object with ``state_dict`` /
    ``load_state_dict`` (fabric/strategies/strategy.py, ``_Stateful``)."""
    from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision

    fabric = L.Fabric(
        accelerator="cpu",
        devices=1,
        plugins=[FabricMixedPrecision("16-mixed", "cpu", scaler=scaler)],
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=1e-3))
    state = {"model": model, "optimizer": opt, "scaler": scaler}
    if load is not None:
        fabric.load(load, state)
    scales = []
    for x in _inputs()[start : start + steps]:
        loss = model(x[None]).float().pow(2).mean()
        fabric.backward(loss)
        if clip is not None:
            # Fabric raises on a non-finite norm by default; the scaler skips those steps
            fabric.clip_gradients(model, opt, max_norm=clip, error_if_nonfinite=False)
        opt.step()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    if save is not None:
        fabric.save(save, state)
    return scales, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("clip", [None, 0.05], ids=["no-clip", "clip"])
def test_fabric_matches_torchs_scaler_and_resumes_exactly(tmp_path, clip):
    s_torch, p_torch = _fabric_run(TorchScaler("cpu", **SCALER_ARGS), 8, tmp_path, clip=clip)
    ours = GradScaler("cpu", **SCALER_ARGS)
    s_ours, p_ours = _fabric_run(ours, 8, tmp_path, clip=clip)
    assert s_ours == s_torch and ours.skipped_steps == 2
    assert _same_parameters(p_ours, p_torch)
    ckpt = tmp_path / "fabric.ckpt"
    s_first, _ = _fabric_run(GradScaler("cpu", **SCALER_ARGS), 4, tmp_path, save=ckpt, clip=clip)
    assert torch.load(ckpt, weights_only=True)["scaler"]["scale"] == s_first[-1]
    s_rest, p_rest = _fabric_run(
        GradScaler("cpu", **SCALER_ARGS), 4, tmp_path, start=4, load=ckpt, clip=clip
    )
    assert s_first + s_rest == s_ours
    assert _same_parameters(p_rest, p_ours)


# ---- accelerate --------------------------------------------------------------------------


@pytest.fixture
def fresh_accelerate_state():
    """AcceleratorState is a process-wide singleton; each Accelerator here starts anew."""
    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def _accelerator(scaler, accumulate=1):
    """``Accelerator(mixed_precision="fp16", cpu=True)`` with `scaler` as its scaler.

    accelerate 1.15 makes no GradScaler on the CPU (accelerator.py: fp16 needs
    ``device.type != "cpu"`` for ``native_amp`` and a scaler), and
    ``GradScalerKwargs`` only configures the torch scaler it would make.  So the
    scaler is set as ``Accelerator.scaler`` before ``prepare()``, which hands it to the
    AcceleratedOptimizer; ``backward`` then calls ``scaler.scale(loss).backward()`` and
    the optimizer's ``step`` calls ``scaler.step(optimizer, closure)`` and
    ``scaler.update()`` (optimizer.py).  ``accelerator.autocast()`` is a no-op there
    for the same reason, so the steps autocast with torch's own context."""
    acc = accelerate.Accelerator(
        mixed_precision="fp16", cpu=True, gradient_accumulation_steps=accumulate
    )
    assert acc.scaler is None
    acc.scaler = scaler
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-3))
    assert opt.scaler is scaler
    return acc, model, opt


def _train(acc, model, opt, epochs=1, clip=None):
    """(scale after each step, whether accelerate saw each step skipped).

    ``accelerator.clip_grad_norm_`` unscales through ``unscale_gradients``, which does
    nothing without ``native_amp``, so on the CPU the scaler unscales the wrapped
    optimizer first, as ``unscale_gradients`` does on a GPU."""
    scales, skipped = [], []
    for _ in range(epochs):
        for x in _inputs():
            with acc.accumulate(model):
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = model(x[None]).float().pow(2).mean()
                acc.backward(loss)
                if clip is not None:
                    acc.scaler.unscale_(opt.optimizer)
                    acc.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                opt.zero_grad()
            scales.append(acc.scaler.get_scale())
            skipped.append(acc.optimizer_step_was_skipped)
    return scales, skipped


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "clip, accumulate", [(None, 1), (0.05, 1), (None, 2)], ids=["plain", "clip", "accumulate"]
)
def test_accelerate_training_matches_torchs_scaler(fresh_accelerate_state, clip, accumulate):
    """Also with ``gradient_accumulation_steps=2`` under ``accelerator.accumulate``,
    where the optimizer's step calls the scaler only on the syncing batch."""
    runs = []
    for cls in (TorchScaler, GradScaler):
        AcceleratorState._reset_state(True)
        acc, model, opt = _accelerator(cls("cpu", **SCALER_ARGS), accumulate)
        runs.append((_train(acc, model, opt, epochs=2, clip=clip), _params(model), acc.scaler))
    ((s_torch, k_torch), p_torch, _), ((s_ours, k_ours), p_ours, ours) = runs
    assert isinstance(ours, TorchScaler)
    assert s_ours == s_torch and k_ours == k_torch
    assert ours.skipped_steps == 4 and len(set(s_ours)) > 2
    assert _same_parameters(p_ours, p_torch)


@pytest.mark.parametrize("fsdp2_order", [False, True], ids=["load_state", "fsdp2-order"])
def test_accelerate_save_state_load_state_resumes_exactly(
    tmp_path, fresh_accelerate_state, fsdp2_order
):
    """``save_state`` writes ``scaler.state_dict()`` to scaler.pt; a fresh Accelerator
    with a fresh lscore scaler ``load_state``s model, optimizer and scaler and ends
    bitwise where one uninterrupted run ends.  fsdp2-order also makes the calls
    accelerate's load_state makes for FSDP2 before the optimizer is restored
    (accelerator.py): ``scaler.load_state_dict(torch.load(scaler.pt))`` then
    ``scaler._lazy_init_scale_growth_tracker(scaler._device)``, a string device."""
    acc, model, opt = _accelerator(GradScaler("cpu", **SCALER_ARGS))
    full_scales, full_skipped = _train(acc, model, opt, epochs=2)
    p_full = _params(model)

    AcceleratorState._reset_state(True)
    acc, model, opt = _accelerator(GradScaler("cpu", **SCALER_ARGS))
    first_scales, first_skipped = _train(acc, model, opt)
    acc.save_state(tmp_path / "state")
    saved = torch.load(tmp_path / "state" / "scaler.pt", weights_only=True)
    assert saved == acc.scaler.state_dict() and saved["scale"] != SCALER_ARGS["init_scale"]

    AcceleratorState._reset_state(True)
    fresh = GradScaler("cpu", **SCALER_ARGS)
    acc, model, opt = _accelerator(fresh)
    if fsdp2_order:
        fresh.load_state_dict(torch.load(tmp_path / "state" / "scaler.pt"))
        fresh._lazy_init_scale_growth_tracker(fresh._device)
    acc.load_state(tmp_path / "state")
    assert fresh.state_dict() == saved
    scales, skipped = _train(acc, model, opt)
    assert first_scales + scales == full_scales
    assert first_skipped + skipped == full_skipped
    assert _same_parameters(_params(model), p_full)
