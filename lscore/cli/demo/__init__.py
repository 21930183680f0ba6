"""``lscore demo``: a language model trained in float16 with and without loss scaling.

:mod:`~lscore.cli.demo.model` holds the model, the data and the records every
backend fills; ``numpy_backend``, ``torch_backend`` and ``cupy_backend`` each
train one mode with ``train(mode, model0, data, cfg, progress)``;
:mod:`~lscore.cli.demo.main` picks the backend and runs the modes, and
:mod:`~lscore.cli.demo.report` prints the table and draws the figure;
:mod:`~lscore.cli.demo.fp8` trains the ``--fp8`` modes (bfloat16, FP8 linear
layers under delayed and current scaling) and shows them.
"""

from lscore.cli.demo.main import FP8_OUTPUTS, OUTPUTS, check_out, run
from lscore.cli.demo.model import MODES, config

__all__ = ["FP8_OUTPUTS", "MODES", "OUTPUTS", "check_out", "config", "run"]
