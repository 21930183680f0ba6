"""One device per state: a sync-free LossScaleOptimizer refuses to step while another device
is current, before anything runs (lscore.adapters.cupy's classes on the host harness).

Two stand-in devices: each device's kernel backend is the harness (host memory, kernels run
on the CPU) with its own id, and `current` plays cupy.cuda.Device().  A sync-free step's
kernels read the device state's found flag, inverse scale and step counter through
pointers: with another device current they would run on that device's stream and read the
first device's memory, so the step must be refused, naming both devices.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from helpers.cuda_host.adapter import CountingBackend
from lscore import kernels
from lscore.adapters import device
from lscore.cuda.arrays import ArrayKernels

GRAD = np.linspace(-1.0, 1.0, 96, dtype=np.float32).astype(np.float16)


class StandInDevice(CountingBackend):
    """The harness as device `device`; `made` lists every device a backend was made for."""

    made: ClassVar[list[int]] = []

    def __init__(self, device: int):
        super().__init__()
        self.device = device
        StandInDevice.made.append(device)


@pytest.fixture
def two_devices():
    """(bound adapter classes, the kernels, a one-element list holding the current device)."""
    StandInDevice.made = []
    current = [0]
    kern = ArrayKernels(np, StandInDevice, kind=kernels.READ_NUMPY, limits=dict(chunk=64, block=8))
    bound = device.bind(np, kern, current_device=lambda: current[0])
    return bound, kern, current


def make(bound, name: str, sync_free: bool):
    inner = bound.SGD(0.1, momentum=0.9) if name == "sgd" else bound.Adam(0.01)
    return bound.LossScaleOptimizer(inner, sync_free=sync_free, initial_scale=2.0**10)


def grads_of(scale):
    return np.float32(1.5), [GRAD * np.asarray(scale).astype(np.float16)]


def launches(kern) -> int:
    return len(kern.device(0).backend.launches)


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_sync_free_step_with_another_device_current_is_refused(two_devices, name):
    bound, kern, current = two_devices
    w = np.ones(GRAD.shape, np.float32)
    opt = make(bound, name, sync_free=True)
    opt.minimize(grads_of, [w])
    before = (w.copy(), launches(kern), CountingBackend.uploads, CountingBackend.syncs)

    current[0] = 1
    called = []

    def backward(scale):
        called.append(scale)
        return grads_of(scale)

    expected = r"keeps its loss scale on device 0, but device 1 is current.*cupy\.cuda\.Device\(0\)"
    with pytest.raises(RuntimeError, match=expected):
        opt.minimize(backward, [w])
    with pytest.raises(RuntimeError, match=expected):
        opt.apply_gradients([(GRAD, w)])
    with pytest.raises(RuntimeError, match=expected):
        opt.get_scaled_loss(np.float32(2.0))
    with pytest.raises(RuntimeError, match=expected):
        opt.get_unscaled_gradients([GRAD])
    with pytest.raises(RuntimeError, match=expected):
        opt.compute_gradients(backward, [w])
    assert called == []  # refused before the backward pass
    assert np.array_equal(w, before[0])
    assert (launches(kern), CountingBackend.uploads, CountingBackend.syncs) == before[1:]
    assert StandInDevice.made == [0]  # nothing was set up on device 1

    # the refused calls left no trace: back on device 0 the run matches one never refused
    current[0] = 0
    opt.minimize(grads_of, [w])
    w_ref = np.ones(GRAD.shape, np.float32)
    ref = make(bound, name, sync_free=True)
    ref.minimize(grads_of, [w_ref])
    ref.minimize(grads_of, [w_ref])
    assert w.tobytes() == w_ref.tobytes()
    assert (opt.loss_scale, opt.iterations) == (ref.loss_scale, ref.iterations)


def test_the_state_can_be_read_from_any_device(two_devices):
    """Reading copies from the state's own device: allowed whatever device is current."""
    bound, _, current = two_devices
    w = np.ones(GRAD.shape, np.float32)
    opt = make(bound, "sgd", sync_free=True)
    opt.minimize(lambda scale: (np.float32(0), [np.full(GRAD.shape, np.inf, np.float16)]), [w])
    current[0] = 1
    assert opt.loss_scale == 2.0**9  # the overflow halved it, on device 0
    opt.sync_state()
    assert opt.dynamic_counter == 0


def test_each_device_keeps_its_own_optimizer(two_devices):
    bound, kern, current = two_devices
    w0, w1 = np.ones(GRAD.shape, np.float32), np.ones(GRAD.shape, np.float32)
    opt0 = make(bound, "adam", sync_free=True)
    current[0] = 1
    opt1 = make(bound, "adam", sync_free=True)
    for _ in range(3):
        current[0] = 0
        opt0.minimize(grads_of, [w0])
        current[0] = 1
        opt1.minimize(grads_of, [w1])
    assert StandInDevice.made == [0, 1]
    assert len(kern.device(1).backend.launches) == len(kern.device(0).backend.launches) > 0
    assert w0.tobytes() == w1.tobytes() and not np.array_equal(w0, 1)


def test_the_default_mode_keeps_its_state_on_the_host(two_devices):
    """sync_free=False reads the flag each step and decides on the host: no device to
    guard, so any current device serves its steps."""
    bound, _, current = two_devices
    w, w_ref = np.ones(GRAD.shape, np.float32), np.ones(GRAD.shape, np.float32)
    opt, ref = make(bound, "sgd", sync_free=False), make(bound, "sgd", sync_free=False)
    opt.minimize(grads_of, [w])
    ref.minimize(grads_of, [w_ref])
    current[0] = 1
    opt.minimize(grads_of, [w])
    current[0] = 0
    ref.minimize(grads_of, [w_ref])
    assert w.tobytes() == w_ref.tobytes() and opt.loss_scale == ref.loss_scale
