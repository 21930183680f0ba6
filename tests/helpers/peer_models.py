"""Each peer's update rule, transliterated from its source as a small plain-Python model.

These models are independent of lscore's generic state machine: the preset
table must map every peer onto the core so that the core reproduces them.
``step(finite)`` returns should_apply, or raises FloatingPointError where the
peer gives up.  float32 peers round with NumPy exactly as the peer does.
"""

from __future__ import annotations

import math

import numpy as np

F32_MAX = float(np.finfo(np.float32).max)
TINY = float(np.finfo(np.float32).tiny)


def f32(x: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def f32mul(a: float, b: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(a) * np.float32(b))


def f32div(a: float, b: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(a) / np.float32(b))


def ftz(x: float) -> float:
    return 0.0 if abs(x) < TINY else x


class Torch:
    def __init__(
        self,
        device="cuda",
        init_scale=2.0**16,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2000,
        enabled=True,
    ):
        self.enabled = enabled
        self.scale = f32(init_scale) if enabled else 1.0
        self.g, self.b, self.n, self.tracker = growth_factor, backoff_factor, growth_interval, 0

    def step(self, finite):
        if not self.enabled:
            return True
        if not finite:
            self.scale, self.tracker = f32(self.scale * self.b), 0
        elif self.tracker + 1 == self.n:
            new = f32(self.scale * self.g)
            self.scale = new if math.isfinite(new) else self.scale
            self.tracker = 0
        else:
            self.tracker += 1
        return finite


class Nemo(Torch):
    def __init__(self, hysteresis=1, **kw):
        super().__init__(**kw)
        self.h = self.left = hysteresis

    def step(self, finite):
        if not self.enabled:
            return True
        if not finite:
            self.left -= 1
            if self.left <= 0:
                return super().step(False)
            self.tracker = 0
            return False
        super().step(True)
        self.left = self.h
        return True


class TF2:
    def __init__(self, initial_loss_scale=2**15, increment_period=2000, multiplier=2.0):
        self.scale, self.n, self.m, self.good = (
            f32(initial_loss_scale),
            int(increment_period),
            multiplier,
            0,
        )

    def step(self, finite):
        if finite:
            if self.good + 1 >= self.n:
                new = f32mul(self.scale, self.m)
                self.scale = new if math.isfinite(new) else self.scale
                self.good = 0
            else:
                self.good += 1
        else:
            self.good = 0
            self.scale = max(f32div(self.scale, self.m), 1.0)
        return finite


class Keras2(TF2):
    def __init__(self, dynamic=True, initial_scale=None, dynamic_growth_steps=None):
        self.dynamic = dynamic
        super().__init__(
            2**15 if initial_scale is None else initial_scale,
            2000 if dynamic_growth_steps is None else dynamic_growth_steps,
            2.0,
        )

    def step(self, finite):
        return super().step(finite) if self.dynamic else True


class Keras3:
    def __init__(self, initial_scale=2.0**15, dynamic_growth_steps=2000, name=None, dynamic=True):
        self.scale, self.n, self.counter = f32(initial_scale), dynamic_growth_steps, 0

    def step(self, finite):
        if finite:
            if self.counter == self.n - 1:
                self.counter, self.scale = 0, ftz(f32mul(self.scale, 2.0))
            else:
                self.counter += 1
        else:
            self.counter, self.scale = 0, ftz(f32mul(self.scale, 0.5))
        return finite


class TF1:
    def __init__(
        self,
        init_loss_scale,
        incr_every_n_steps,
        decr_every_n_nan_or_inf=2,
        incr_ratio=2,
        decr_ratio=0.8,
    ):
        self.scale, self.incr_n, self.decr_n = (
            f32(init_loss_scale),
            int(incr_every_n_steps),
            decr_every_n_nan_or_inf,
        )
        self.incr, self.decr, self.good, self.bad = incr_ratio, decr_ratio, 0, 0

    def step(self, finite):
        if finite:
            if self.good + 1 >= self.incr_n:
                new = f32mul(self.scale, self.incr)
                self.scale = new if math.isfinite(new) else self.scale
                self.good = self.bad = 0
            else:
                self.good += 1
        elif self.bad + 1 >= self.decr_n:
            self.scale = max(1.0, f32mul(self.scale, self.decr))
            self.good = self.bad = 0
        else:
            self.bad, self.good = self.bad + 1, 0
        return finite


class Apex:
    def __init__(
        self,
        loss_scale="dynamic",
        init_scale=2.0**16,
        scale_factor=2.0,
        scale_window=2000,
        min_loss_scale=None,
        max_loss_scale=2.0**24,
    ):
        self.dynamic = loss_scale == "dynamic"
        self.scale = min(max_loss_scale, init_scale) if self.dynamic else float(loss_scale)
        self.lo, self.hi, self.window, self.unskipped = (
            min_loss_scale,
            max_loss_scale,
            scale_window,
            0,
        )

    def step(self, finite):
        if not self.dynamic:
            return True
        if not finite:
            self.scale = max(self.lo, self.scale / 2.0) if self.lo else self.scale / 2.0
            self.unskipped = 0
        else:
            self.unskipped += 1
        if self.unskipped == self.window:
            self.scale, self.unskipped = min(self.hi, self.scale * 2.0), 0
        return finite


class ApexFp16Utils:
    def __init__(self, init_scale=2**32, scale_factor=2.0, scale_window=1000):
        self.scale, self.f, self.w = float(init_scale), scale_factor, scale_window
        self.it, self.last = 0, -1

    def step(self, finite):
        if not finite:
            self.scale, self.last = max(self.scale / self.f, 1), self.it
        elif (self.it - self.last) % self.w == 0:
            self.scale *= self.f
        self.it += 1
        return finite


class DeepSpeed:
    def __init__(
        self,
        init_scale=2.0**16,
        scale_window=1000,
        min_scale=1.0,
        delayed_shift=2,
        consecutive_hysteresis=False,
        raise_error_at_min_scale=True,
    ):
        self.scale, self.w, self.lo, self.shift = (
            float(init_scale),
            scale_window,
            min_scale,
            delayed_shift,
        )
        self.cons, self.raise_, self.hyst, self.it, self.last = (
            consecutive_hysteresis,
            raise_error_at_min_scale,
            delayed_shift,
            0,
            -1,
        )

    def step(self, finite):
        if not finite:
            if self.shift == 1 or self.hyst == 1:
                if self.scale == self.lo and self.raise_:
                    raise FloatingPointError("already at minimum")
                self.scale = max(self.scale / 2.0, self.lo)
            else:
                self.hyst -= 1
            self.last = self.it
        else:
            if self.cons:
                self.hyst = self.shift
            stable = self.it - self.last - 1
            if stable > 0 and stable % self.w == 0:
                if not self.cons:
                    self.hyst = self.shift
                self.scale *= 2.0
        self.it += 1
        return finite


class Megatron:
    def __init__(
        self,
        initial_scale=2.0**32,
        min_scale=1.0,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=1000,
        hysteresis=2,
    ):
        self.scale, self.lo, self.g, self.b = (
            f32(initial_scale),
            f32(min_scale),
            growth_factor,
            backoff_factor,
        )
        self.n, self.h, self.growth, self.left = growth_interval, hysteresis, 0, hysteresis

    def step(self, finite):
        if not finite:
            self.growth, self.left = 0, self.left - 1
            if self.left <= 0:
                self.scale = max(f32mul(self.scale, self.b), self.lo)
        else:
            self.growth += 1
            if self.growth == self.n:
                self.growth, self.left = 0, self.h
                self.scale = f32mul(self.scale, self.g)
        return finite


class Fairseq:
    def __init__(
        self,
        init_scale=2.0**15,
        scale_factor=2.0,
        scale_window=2000,
        tolerance=0.0,
        threshold=None,
        min_loss_scale=1e-4,
    ):
        self.scale, self.f, self.w, self.tol, self.thr, self.lo = (
            float(init_scale),
            scale_factor,
            scale_window,
            tolerance,
            threshold,
            min_loss_scale,
        )
        self.it, self.last_overflow, self.last_rescale, self.overflows = 0, -1, -1, 0

    def step(self, finite):
        if finite:  # FP16Optimizer.step -> update()
            if (self.it - self.last_overflow) % self.w == 0:
                self.scale *= self.f
                self.last_rescale = self.it
            self.it += 1
            return True
        prev = self.scale  # check_overflow
        since = self.it - self.last_rescale
        self.last_overflow = self.it
        self.overflows += 1
        if self.overflows / float(since) >= self.tol:
            self.scale /= self.f
            if self.thr is not None:
                self.scale = max(self.scale, self.thr)
            self.last_rescale, self.overflows = self.it, 0
        if self.scale <= self.lo:
            self.scale = prev
            raise FloatingPointError("minimum loss scale reached")
        self.it += 1
        return False  # fairseq: OverflowError, step skipped


class Paddle:
    def __init__(
        self,
        enable=True,
        init_loss_scaling=2.0**16,
        incr_ratio=2.0,
        decr_ratio=0.5,
        incr_every_n_steps=2000,
        decr_every_n_nan_or_inf=1,
        use_dynamic_loss_scaling=True,
    ):
        self.enable, self.dyn = enable, use_dynamic_loss_scaling
        self.scale = f32(init_loss_scaling) if enable else 1.0
        self.incr, self.decr, self.incr_n, self.decr_n = (
            incr_ratio,
            decr_ratio,
            incr_every_n_steps,
            decr_every_n_nan_or_inf,
        )
        self.incr_count = self.decr_count = 0

    def step(self, finite):
        if not self.enable:
            return True
        if not self.dyn:
            return finite
        if not finite:
            self.incr_count, self.decr_count = 0, self.decr_count + 1
            if self.decr_count == self.decr_n:
                self.scale, self.decr_count = f32mul(self.scale, self.decr), 0
        else:
            self.decr_count, self.incr_count = 0, self.incr_count + 1
            if self.incr_count == self.incr_n:
                self.scale, self.incr_count = f32mul(self.scale, self.incr), 0
        return finite


class Jmp:
    def __init__(self, loss_scale, counter=0, period=2000, factor=2, min_loss_scale=1.0):
        self.scale, self.counter, self.period, self.factor, self.lo = (
            f32(loss_scale),
            counter,
            period,
            factor,
            f32(min_loss_scale),
        )

    def step(self, finite):
        if finite:
            if self.counter == self.period - 1:
                new = ftz(f32mul(self.scale, self.factor))
                self.scale = new if math.isfinite(new) else self.scale
            self.counter = (self.counter + 1) % self.period
        else:
            self.counter = 0
            self.scale = max(self.lo, ftz(f32div(self.scale, self.factor)))
        return finite


class ColossalAI:
    def __init__(
        self,
        initial_scale=2**16,
        growth_factor=2,
        backoff_factor=0.5,
        growth_interval=1000,
        min_scale=None,
        max_scale=None,
        hysteresis=2,
        verbose=False,
    ):
        self.scale = f32(initial_scale)
        self.lo = f32(min_scale) if min_scale else None
        self.hi = f32(max_scale) if max_scale else None
        self.g, self.b, self.n, self.h = growth_factor, backoff_factor, growth_interval, hysteresis
        self.growth = self.hyst = 0

    def step(self, finite):
        if not finite:
            self.hyst, self.growth = self.hyst + 1, 0
            if self.hyst >= self.h:
                self.scale = f32mul(self.scale, self.b)
                if self.lo:
                    self.scale = max(self.scale, self.lo)
        else:
            self.growth += 1
            if self.growth == self.n:
                self.growth = self.hyst = 0
                self.scale = f32mul(self.scale, self.g)
                if self.hi:
                    self.scale = min(self.scale, self.hi)
        return finite


class Chainer:
    def __init__(self, interval=1000, scale=None):
        self.dynamic = scale is None
        self.scale = 1.0 if self.dynamic else scale
        self.mult, self.ever = math.pow(2.0, 1.0 / interval), False

    def step(self, finite):
        if not self.dynamic:
            return True
        if not finite:
            self.ever, m = True, 0.5
        else:
            m = self.mult if self.ever else 2.0
        self.scale = max(1, min(65504, self.scale * m))
        return finite


class MXNet:
    def __init__(self, loss_scale=2.0**16, max_loss_scale=2.0**24, scale_seq_len=2000):
        self.scale = self.next = float(loss_scale)
        self.hi, self.n, self.unskipped = max_loss_scale, scale_seq_len, 0

    def step(self, finite):
        self.scale = self.next
        if not finite:
            self.next, self.unskipped = self.scale / 2.0, 0
        else:
            self.unskipped += 1
        if self.unskipped == self.n:
            self.unskipped, self.next = 0, min(self.hi, self.scale * 2.0)
        return finite


MODELS = {
    "torch": Torch,
    "nemo": Nemo,
    "tf2": TF2,
    "keras2": Keras2,
    "keras3": Keras3,
    "tf1": TF1,
    "apex": Apex,
    "apex_fp16_utils": ApexFp16Utils,
    "deepspeed": DeepSpeed,
    "megatron": Megatron,
    "fairseq": Fairseq,
    "paddle": Paddle,
    "jmp": Jmp,
    "colossalai": ColossalAI,
    "chainer": Chainer,
    "mxnet": MXNet,
}
